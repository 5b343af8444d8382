"""The argument parser of ``rl-gap fit|...``: the loss block checked before jsonargparse types it.

- the command line's ``--config`` files found (:func:`config_file_args`), and a recipe path
  that is not there replaced by the recipe shipped in the package (:func:`with_shipped_recipes`);
- a loss section read by :func:`rl_gap.losses.registry.read_loss_section` (an unknown loss
  or key is one line naming it, not a Union traceback), with the recipe files' own sections,
  so that a recipe with loose (old-style) loss keys is refused when the loss is swapped;
- under ``--print_config`` the loss section shown as it will be built;
- ``trainer.accumulate_grad_batches > 1`` refused for a ranking module unless
  ``model.allow_split_batch`` is true (``rl_gap.modules.split_batch``).

Values (``temperature: 0``, ``lr: -1``) are checked where they are used, when the module
is built; :mod:`rl_gap.training.cli` reports those errors as one line naming the key.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.cli import LightningArgumentParser

from rl_gap.losses.registry import LossSectionError, read_loss_section
from rl_gap.resources import recipe_path
from rl_gap.training.early_checks import config_file_args  # noqa: F401  (re-exported)

_SUBCOMMANDS = ("fit", "validate", "test", "predict")


# a number argparse would take for an option: "-1e-3", "-.5e2", "-inf" (it accepts only -1, -0.5)
_NEGATIVE_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?|-inf(inity)?", re.IGNORECASE)


def joined_negative_values(words: list[str]) -> list[str]:
    """``--key -1e-3`` -> ``--key=-1e-3``: argparse reads a value like ``-1e-3`` as an option
    and fails with "expected one argument"; written with ``=`` it is the key's value."""
    out: list[str] = []
    for word in words:
        if (
            out
            and _NEGATIVE_NUMBER.fullmatch(word)
            and out[-1].startswith("--")
            and "=" not in out[-1]
        ):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def with_shipped_recipes(words: list[str]) -> list[str]:
    """``--config recipes/x/y.yaml`` outside a checkout: the recipe shipped in the package.

    A path that exists is kept as given; one that does not but names a shipped recipe
    (``recipes/demo/mnist_gsap.yaml`` or ``demo/mnist_gsap``) is replaced by the installed
    file, so the README's commands also work from a wheel installed anywhere.
    """
    out = list(words)
    for i, word in enumerate(out):
        if i > 0 and out[i - 1] in ("--config", "-c"):
            prefix, value = "", word
        elif word.startswith("--config="):
            prefix, value = "--config=", word.split("=", 1)[1]
        else:
            continue
        if not Path(value).exists():
            # a name that is neither a file nor a shipped recipe: check_config_file names it
            with contextlib.suppress(FileNotFoundError):
                out[i] = prefix + str(recipe_path(value))
    return out


def recipe_loss_section(path: str | Path) -> Any:
    """A recipe file's own ``loss:`` section as written (None if it has none or is unreadable)."""
    try:
        content = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None  # check_config_file reports unreadable files
    if not isinstance(content, dict):
        return None
    models = [content.get("model")]
    models += [content[s].get("model") for s in _SUBCOMMANDS if isinstance(content.get(s), dict)]
    for model in models:
        if isinstance(model, dict):
            section = (model.get("init_args") or {}).get("loss", model.get("loss"))
            if section is not None:
                return section
    return None


def _recipe_sections(config_files: Iterable[Any] | None) -> list[tuple[str, Any]]:
    """``(file, its own loss section)`` of each ``--config`` file."""
    return [
        (str(path), recipe_loss_section(str(getattr(path, "absolute", path))))
        for path in config_files or []
    ]


class RLGapArgumentParser(LightningArgumentParser):
    """Checks the model's ``loss:`` section against the loss registry while parsing.

    The check runs before jsonargparse validates types or prints
    ``--print_config``, so a misspelt loss name or key is one line naming the
    valid ones (instead of an error from every member of the model's type union
    when the model is built). A swap (``--model.loss.name``) on a recipe whose
    loss keys sit outside a per-loss table is refused, naming them. Under
    ``--print_config`` the loss section is printed as it will be built: ``name``
    and the chosen loss's table with every keyword resolved (command-line
    values moved in, defaults filled), the other losses' tables kept.
    """

    def _parse_common(self, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        for prefix in ("", *(f"{s}." for s in _SUBCOMMANDS)):
            key = f"{prefix}model.init_args.loss"
            try:
                section = cfg.get(key)
            except (KeyError, AttributeError, TypeError):
                continue
            section = _typed_tables(section)
            if section is not None:
                cfg[key] = section
                recipes = _recipe_sections(cfg.get(f"{prefix}config"))
                try:
                    loss = read_loss_section(section, recipes=recipes)
                except LossSectionError as err:
                    self.error(f"--model.loss: {err}")
                if _print_config_requested(self):
                    cfg[key] = loss.as_recipe(expand=True)
            message = _split_batch_error(cfg, prefix)
            if message:  # one line, not argparse's usage block: the fix is in the message
                sys.stderr.write(f"rl-gap: error: {message}\n")
                raise SystemExit(2)
        return super()._parse_common(cfg, *args, **kwargs)


def _typed_tables(section: Any) -> Any:
    """Per-loss table values given as ``--model.loss.<loss>.<key> V`` arrive as strings:
    read them as YAML, as jsonargparse reads the flat ``--model.loss.<key> V``."""
    if hasattr(section, "as_dict"):
        section = section.as_dict()
    if not isinstance(section, dict):
        return section
    out = dict(section)
    for key, table in section.items():
        if isinstance(table, dict):
            out[key] = {k: yaml.safe_load(v) if isinstance(v, str) else v for k, v in table.items()}
    return out


def _print_config_requested(parser: Any) -> bool:
    while parser is not None:
        if hasattr(parser, "print_config"):
            return True
        parser = getattr(parser, "parent_parser", None)
    return False


def _split_batch_error(cfg: Any, prefix: str) -> str | None:
    """Gradient accumulation would hand a ranking loss parts of its batch (and no opt-in)."""
    from rl_gap.modules.batch_settings import split_batch_error

    try:
        factor = cfg.get(f"{prefix}trainer.accumulate_grad_batches")
        init_args = cfg.get(f"{prefix}model.init_args")
    except (KeyError, AttributeError, TypeError):
        return None
    if init_args is None or not hasattr(init_args, "get") or "allow_split_batch" not in init_args:
        return None  # not a ranking module
    if not isinstance(factor, int) or factor <= 1 or init_args.get("allow_split_batch"):
        return None
    return split_batch_error("trainer.accumulate_grad_batches", factor)
