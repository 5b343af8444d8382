"""The argument parser of ``rl-gap fit|...``: the loss block checked before jsonargparse types it.

- the command line's ``--config`` files found (:func:`config_file_args`), and a recipe path
  that is not there replaced by the recipe shipped in the package (:func:`with_shipped_recipes`);
- a loss section's per-loss tables and command-line values resolved as they will be built
  (``--print_config`` shows exactly that);
- a recipe with loose (old-style) loss keys refused when the loss is swapped;
- the loss's and the optimizer's own value checks (``temperature: 0``, ``lr: -1``) as one
  line naming the key, not a Union traceback;
- ``trainer.accumulate_grad_batches > 1`` refused for a ranking module unless
  ``model.allow_split_batch`` is true (``rl_gap.modules.split_batch``).
"""

from __future__ import annotations

import contextlib
import inspect
import re
import warnings
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.cli import LightningArgumentParser

from rl_gap.losses.registry import normalize_loss_section
from rl_gap.resources import recipe_path
from rl_gap.training.run_config import loss_section_error

_SUBCOMMANDS = ("fit", "validate", "test", "predict")


# (recipe file, its loss name, its flat loss keys) of the command being parsed.
RECIPE_LOSS_KEYS: ContextVar[tuple[tuple[str, str, tuple[str, ...]], ...]] = ContextVar(
    "rl_gap_recipe_loss_keys", default=()
)


def config_file_args(words: list[str]) -> list[str]:
    """The values of ``--config``/``-c`` in a command line."""
    found = []
    for i, word in enumerate(words):
        if word in ("--config", "-c") and i + 1 < len(words):
            found.append(words[i + 1])
        elif word.startswith("--config="):
            found.append(word.split("=", 1)[1])
    return found


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


def recipe_flat_loss_keys(path: str | Path) -> tuple[str, tuple[str, ...]] | None:
    """``(loss name, keys outside a per-loss table)`` of a recipe file's loss section."""
    from rl_gap.losses import available_losses

    try:
        content = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None  # check_config_file reports unreadable files
    models = [content.get("model")] if isinstance(content, dict) else []
    if isinstance(content, dict):
        models += [
            content.get(s, {}).get("model")
            for s in _SUBCOMMANDS
            if isinstance(content.get(s), dict)
        ]
    for model in models:
        if not isinstance(model, dict):
            continue
        section = (model.get("init_args") or {}).get("loss", model.get("loss"))
        if isinstance(section, dict):
            names = set(available_losses())
            flat = tuple(
                sorted(str(k) for k in section if k != "name" and str(k).lower() not in names)
            )
            return str(section.get("name", "gsap")).lower(), flat
    return None


def _swap_leak_error(section: Any) -> str | None:
    """A recipe's flat loss keys would reach another loss after ``--model.loss.name``."""
    if hasattr(section, "as_dict"):
        section = section.as_dict()
    if not isinstance(section, dict):
        return None
    chosen = str(section.get("name", "gsap")).lower()
    for path, name, flat in RECIPE_LOSS_KEYS.get():
        if flat and name != chosen:
            moved = ", ".join(f"loss.{name}.{k}" for k in flat)
            return (
                f"{path} sets {list(flat)} for {name!r} outside a per-loss table, and the loss "
                f"is now {chosen!r}: they would be applied to {chosen!r}. A loss's "
                f"hyperparameters belong to that loss: write them as {moved} (and "
                f"{chosen}'s own under loss.{chosen}, else its defaults are used)"
            )
    return None


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
            message = (
                loss_section_error(section)
                or _swap_leak_error(section)
                or _loss_value_error(section)
            )
            if message:
                self.error(f"--model.loss: {message}")
            message = _optimizer_settings_error(cfg.get(f"{prefix}model.init_args"))
            if message:
                self.error(f"--model.init_args: {message}")
            message = _split_batch_error(cfg, prefix)
            if message:
                self.error(message)
            if section is not None and _print_config_requested(self):
                cfg[key] = normalize_loss_section(section, expand=True)
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


def _loss_value_error(section: Any) -> str | None:
    """The loss's own check of its values (``temperature: 0``), or None."""
    from rl_gap.losses import loss_from_config

    if section is None:
        return None
    section = section.as_dict() if hasattr(section, "as_dict") else dict(section)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss_from_config(section)
    except ValueError as err:
        return str(err)
    return None


def _optimizer_settings_error(init_args: Any) -> str | None:
    """``check_optimizer_settings`` on a model's ``init_args`` (``lr: -1``, ``optimizer: adamx``)."""
    from rl_gap.optim import check_optimizer_settings

    if init_args is None or not hasattr(init_args, "get"):
        return None
    names = inspect.signature(check_optimizer_settings).parameters
    settings = {k: init_args.get(k) for k in names if k in init_args}
    if not {"optimizer", "lr", "weight_decay"} <= set(settings):
        return None  # a module without rl_gap's optimizer settings
    try:
        check_optimizer_settings(**settings)
    except (ValueError, TypeError) as err:
        return str(err)
    return None


def _split_batch_error(cfg: Any, prefix: str) -> str | None:
    """Gradient accumulation would hand a ranking loss parts of its batch (and no opt-in)."""
    from rl_gap.modules.split_batch import split_batch_error

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
