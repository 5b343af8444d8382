"""A training run's identity: its resolved config, run folder name and resume checks.

Pure helpers (no Lightning) used by :mod:`rl_gap.training.cli` and
:mod:`rl_gap.training.fault_tolerance`:

- :func:`flatten_config` turns a resolved LightningCLI config into ``{dotted.key: value}``
  with plain JSON values (what a checkpoint stores, safe for ``torch.load(weights_only=True)``);
- :func:`training_config` keeps only the keys that change what is trained:
  :data:`OPERATIONAL_KEYS` (logging, output paths, devices, evaluation schedule)
  and dataset locations (:data:`DATA_LOCATION_KEYS`) are dropped, so resuming on
  another GPU count, with another progress bar or with the data at another path is allowed;
- :func:`run_folder_name` is ``seed<N>`` plus ``-<hash>`` of the training keys that
  differ from the recipe's own values, so every override combination and every
  seed gets its own run folder (:func:`run_dir_for` the whole path);
- :func:`config_mismatch` names the keys in which a checkpoint's config and the
  current one differ; :func:`load_checkpoint_file` and :func:`check_config_file`
  turn a wrong file into one clear error;
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

# Keys (dotted prefixes) that change neither what is trained nor what is evaluated:
# never compared on resume, never part of the run folder hash. The validation
# schedule (``check_val_every_n_epoch``, ``val_check_interval``, ``limit_val_batches``)
# is not among them: it decides which metrics a run logs. ``seed_everything`` is in
# the folder name itself, and compared on resume.
OPERATIONAL_KEYS: tuple[str, ...] = (
    "config",
    "ckpt_path",
    "weights_only",
    "output_dir",
    "run_name",
    "wandb",
    "wandb_project",
    "wandb_entity",
    "wandb_tags",
    "wandb_group",
    "force_resume",
    "initial_weights",
    "verbose",  # validate/test: printing only
    "return_predictions",  # predict: what the Python call returns
    "checkpoint_every_n_steps",
    "print_config",
    "trainer.accelerator",
    "trainer.devices",
    "trainer.num_nodes",
    "trainer.strategy",
    "trainer.plugins",
    "trainer.logger",
    "trainer.callbacks",
    "trainer.default_root_dir",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.enable_checkpointing",
    "trainer.log_every_n_steps",
    "trainer.profiler",
    "trainer.max_time",
    "trainer.limit_test_batches",
    "trainer.limit_predict_batches",
    "trainer.num_sanity_val_steps",
    "trainer.barebones",
    "data.init_args.num_workers",
    "data.init_args.eval_batch_size",
    "model.init_args.eval_plots",
)

# Leaf names of dataset *locations* under ``data.``: the same data may live
# elsewhere on another machine (a requeued job, another cluster).
DATA_LOCATION_KEYS: tuple[str, ...] = ("root", "train_dir", "val_dir", "image_root")

_UNSET = "<unset>"


def _plain(value: Any) -> Any:
    """A JSON-representable copy of ``value`` (paths and other objects as strings)."""
    return json.loads(json.dumps(value, default=str))


def flatten_config(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` (or a jsonargparse Namespace) -> ``{"a.b": 1}``, values JSON-plain.

    Lists and scalars are leaves; an empty mapping is kept as ``{}``.
    """
    if hasattr(config, "as_dict"):
        config = config.as_dict()
    if not isinstance(config, Mapping):
        return {prefix: _plain(config)} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if hasattr(value, "as_dict"):
            value = value.as_dict()
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, name))
        else:
            flat[name] = _plain(value)
    return flat


def _is_operational(key: str) -> bool:
    if key.startswith("data.") and key.rsplit(".", 1)[-1] in DATA_LOCATION_KEYS:
        return True
    return any(key == k or key.startswith(k + ".") for k in OPERATIONAL_KEYS)


def training_config(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a flat config that change what is trained (see :data:`OPERATIONAL_KEYS`)."""
    return {k: v for k, v in sorted(flat.items()) if not _is_operational(k)}


def differing_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Sorted keys whose values differ (a key missing on one side differs)."""
    return sorted(k for k in set(a) | set(b) if a.get(k, _UNSET) != b.get(k, _UNSET))


def overrides_hash(current: Mapping[str, Any], baseline: Mapping[str, Any] | None) -> str:
    """8 hex digits of the training keys that differ from ``baseline``; ``""`` if none.

    ``baseline`` is the training config of the recipe alone (no command-line
    overrides); ``None`` (not available) hashes the whole training config.
    ``seed_everything`` is left out: the seed is in the folder name itself.
    """
    current = {k: v for k, v in current.items() if k != "seed_everything"}
    if baseline is None:
        changed = current
    else:
        base = {k: v for k, v in baseline.items() if k != "seed_everything"}
        changed = {k: current.get(k, _UNSET) for k in differing_keys(current, base)}
    if not changed:
        return ""
    text = json.dumps(changed, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def run_folder_name(seed: Any, overrides: str) -> str:
    """``seed0``, ``seed0-1a2b3c4d`` (overrides hash), ``noseed`` when seeding is off.

    ``seedauto`` for ``seed_everything: true`` (or no seed in the recipe): the seed is drawn
    at the first launch and recorded in the run's checkpoints, so that ``--ckpt_path last``
    finds the folder again before the seed is known.
    """
    if seed is True:
        name = "seedauto"
    elif isinstance(seed, int) and not isinstance(seed, bool):
        name = f"seed{seed}"
    else:
        name = "noseed"
    return f"{name}-{overrides}" if overrides else name


def run_dir_for(
    config_files: list[Any] | None,
    output_dir: str,
    run_name: str | None,
    seed: Any = None,
    overrides: str = "",
) -> Path:
    """The run folder: ``<output_dir>/<recipe folder>/<recipe stem>/<seed<N>[-<overrides>]>``
    (the recipe: the first config file).

    ``run_name`` gives ``<output_dir>/<run_name>`` instead. ``seed`` is the
    resolved ``seed_everything`` (None: the folder has no seed level, as for
    callers that only need the recipe's folder); ``overrides`` the hash from
    :func:`overrides_hash`.
    """
    if run_name:
        return Path(output_dir) / run_name
    if config_files:
        # the recipe is the first --config; later ones are overlays (their keys are
        # overrides, in the hash), never the folder's name
        recipe = Path(str(config_files[0]))
        base = Path(output_dir) / recipe.parent.name / recipe.stem
    else:
        base = Path(output_dir) / "run"
    if seed is None and not overrides:
        return base
    return base / run_folder_name(seed, overrides)


def _short(value: Any) -> str:
    text = json.dumps(value) if value is not _UNSET else _UNSET
    return text if len(text) <= 60 else text[:57] + "..."


def config_mismatch(saved: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """None if two training configs agree, else one line per differing key."""
    keys = differing_keys(saved, current)
    if not keys:
        return None
    rows = [
        f"  {k}: checkpoint {_short(saved.get(k, _UNSET))}, now {_short(current.get(k, _UNSET))}"
        for k in keys
    ]
    return "\n".join(rows)


class ResumeMismatchError(ValueError):
    """Resuming a checkpoint written by a different training configuration."""


def resume_mismatch_message(path: str | Path, diff: str) -> str:
    return (
        f"refusing to resume {path}: it was written by a different configuration "
        f"(differing keys below). Start a new run (another --run_name or the default "
        f"per-configuration run folder), or pass --force_resume true to resume anyway.\n{diff}"
    )


# ------------------------------------------------------------------- files
def load_checkpoint_file(path: str | Path) -> dict[str, Any]:
    """Load a Lightning checkpoint for inspection (CPU, memory-mapped), with clear errors.

    Raises:
        FileNotFoundError: no such file (or a folder).
        ValueError: the file is not a checkpoint written by ``torch.save`` with
            a Lightning ``state_dict``.
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist (or is not a file)")
    zipped = zipfile.is_zipfile(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=zipped)
    except Exception as err:  # pickle errors are KeyError/UnpicklingError/EOFError/...
        raise ValueError(
            f"{path} is not a checkpoint: torch.load failed ({type(err).__name__}: {err}). "
            "Pass a .ckpt file written by rl-gap fit (e.g. <run>/checkpoints/last.ckpt) or 'last'."
        ) from err
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        found = sorted(ckpt)[:8] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ValueError(
            f"{path} is not a Lightning checkpoint (no 'state_dict'; found {found}). "
            "Pass a .ckpt file written by rl-gap fit (e.g. <run>/checkpoints/last.ckpt) or 'last'."
        )
    return ckpt


def nonfinite_weights_error(ckpt: Mapping[str, Any], path: str | Path) -> str | None:
    """None if every floating weight in ``ckpt["state_dict"]`` is finite, else a message naming them.

    A diverged run's checkpoint holds NaN/inf weights; resuming or evaluating it would
    only fail (or log NaN) at the first step instead of at load.
    """
    import torch

    bad = [
        name
        for name, value in (ckpt.get("state_dict") or {}).items()
        if isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and not bool(torch.isfinite(value).all())
    ]
    if not bad:
        return None
    shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    return (
        f"{path} holds NaN/inf weights in {len(bad)} tensor(s) ({shown}): the run that wrote it "
        "diverged; resume an earlier checkpoint (e.g. an epoch=... file) or lower the lr"
    )


def check_config_file(path: str | Path) -> None:
    """A recipe/config file must exist and hold a non-empty YAML mapping."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    try:
        content = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"config file {path} is not valid YAML: {err}") from err
    if content is None:
        raise ValueError(
            f"config file {path} is empty; a recipe is a YAML mapping such as "
            "'trainer: {...}', 'model: {...}', 'data: {...}' (see recipes/)"
        )
    if not isinstance(content, Mapping):
        raise ValueError(
            f"config file {path} holds a {type(content).__name__}, not a mapping of recipe keys"
        )
