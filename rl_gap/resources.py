"""Files shipped inside the package: the training recipes.

The recipes live in the repository's top-level ``recipes/`` folder (the paths
the README uses: ``rl-gap fit --config recipes/demo/mnist_gsap.yaml``);
``rl_gap/recipes`` is a link to it, and the wheel carries the YAML files as
package data (``setup.cfg``), so :func:`recipe_path` finds the same files in a
source checkout, an editable install and an installed wheel. (The native
helpers' ``.cpp`` sources are package data too, next to their loaders.)
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["recipes_dir", "recipe_path", "available_recipes"]


def recipes_dir() -> Path:
    """The folder holding ``<task>/<recipe>.yaml`` (inside the installed package)."""
    root = resources.files("rl_gap") / "recipes"
    path = Path(str(root))
    if not path.is_dir():
        raise FileNotFoundError(
            f"rl_gap's recipes are missing: {path} is not a folder (a source checkout links "
            "rl_gap/recipes to ../recipes; a wheel ships them as package data)"
        )
    return path


def available_recipes() -> list[str]:
    """Every shipped recipe as ``<task>/<name>`` (e.g. ``demo/mnist_gsap``), sorted."""
    root = recipes_dir()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.glob("*/*.yaml"))


def recipe_path(name: str) -> Path:
    """The YAML file of a shipped recipe.

    Args:
        name: ``demo/mnist_gsap``, ``demo/mnist_gsap.yaml`` or
            ``recipes/demo/mnist_gsap.yaml`` (the README's form).

    Raises:
        FileNotFoundError: naming the recipe and listing the shipped ones.
    """
    key = Path(name).as_posix().removeprefix("./").removeprefix("recipes/")
    key = key.removesuffix(".yaml")
    path = recipes_dir() / f"{key}.yaml"
    if not path.is_file():
        raise FileNotFoundError(
            f"no recipe {name!r} in {recipes_dir()}; shipped: {', '.join(available_recipes())}"
        )
    return path
