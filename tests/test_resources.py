"""The shipped recipes are found under every spelling the README uses, and a wrong name lists them."""

from pathlib import Path

import pytest

from rl_gap.resources import available_recipes, recipe_path

ROOT = Path(__file__).resolve().parents[1]


def test_every_recipe_in_the_repository_is_shipped():
    want = sorted(p.relative_to(ROOT / "recipes").with_suffix("").as_posix()
                  for p in ROOT.glob("recipes/*/*.yaml"))  # fmt: skip
    assert available_recipes() == want


@pytest.mark.parametrize(
    "name", ["demo/mnist_gsap", "demo/mnist_gsap.yaml", "recipes/demo/mnist_gsap.yaml"]
)
def test_recipe_path_accepts_the_readme_forms(name):
    got = recipe_path(name)
    assert got.read_bytes() == (ROOT / "recipes" / "demo" / "mnist_gsap.yaml").read_bytes()


def test_an_unknown_recipe_names_itself_and_the_shipped_ones():
    with pytest.raises(FileNotFoundError, match=r"no recipe 'demo/nope'.*demo/mnist_gsap"):
        recipe_path("demo/nope")
