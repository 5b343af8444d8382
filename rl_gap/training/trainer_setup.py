"""The trainer's parts that ``rl-gap fit|...`` adds to a recipe's (plain helpers of the CLI).

- :func:`default_callbacks`: a rich progress bar, a learning-rate monitor, checkpoints in
  ``<run>/checkpoints`` with ``last.ckpt`` kept, throughput (``rl_gap.callbacks.speed``) and the
  validation-schedule check, each unless the recipe lists its own;
- :func:`with_atomic_checkpoint_io`: checkpoints written atomically
  (:class:`~rl_gap.training.checkpoint_io.AtomicCheckpointIO`);
- :func:`batch_ranks_error`: a global batch the ranks cannot share, named before any
  process starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import (
    Callback,
    LearningRateMonitor,
    ModelCheckpoint,
    ProgressBar,
    RichProgressBar,
)
from lightning.pytorch.plugins.io import CheckpointIO

from rl_gap.callbacks.speed import TrainingSpeed, throughput_callbacks
from rl_gap.training.checkpoint_io import AtomicCheckpointIO
from rl_gap.training.schedule_check import ValidationScheduleCheck


def batch_ranks_error(trainer: Any, datamodule: Any) -> str | None:
    """A message if the data's global batch is not divisible by the ranks (devices x nodes)."""
    batch = getattr(datamodule, "batch_size", None)
    world = int(getattr(trainer, "num_devices", 1) or 1) * int(
        getattr(trainer, "num_nodes", 1) or 1
    )
    shares_global_batch = getattr(datamodule, "batch_is_global", False)
    if world > 1 and shares_global_batch and isinstance(batch, int) and batch % world:
        return (
            f"data.batch_size {batch} is the global batch and must be divisible by the "
            f"{world} ranks (devices x nodes); use a multiple of {world}"
        )
    return None


def with_atomic_checkpoint_io(plugins: Any) -> list[Any]:
    """The trainer's plugins plus :class:`AtomicCheckpointIO`, unless a ``CheckpointIO`` is given."""
    plugins = [] if plugins is None else list(plugins) if isinstance(plugins, list) else [plugins]
    if not any(isinstance(p, CheckpointIO) for p in plugins):
        plugins.append(AtomicCheckpointIO())
    return plugins


def default_callbacks(config: dict[str, Any], root: Path) -> list[Callback]:
    """The trainer config's callbacks plus rl_gap's defaults (see the module docstring)."""
    given = config.get("callbacks") or []
    given = list(given) if isinstance(given, list) else [given]
    if config.get("enable_progress_bar") is not False and not any(
        isinstance(c, ProgressBar) for c in given
    ):
        given.append(RichProgressBar(leave=True))
    if config.get("logger") and not any(isinstance(c, LearningRateMonitor) for c in given):
        given.append(LearningRateMonitor(logging_interval="step"))
    checkpoints = [c for c in given if isinstance(c, ModelCheckpoint)]
    for cb in checkpoints:  # one folder per run, so that --ckpt_path last finds it
        if cb.dirpath is None:
            cb.dirpath = str(root / "checkpoints")
    if config.get("enable_checkpointing") is not False and not checkpoints:
        given.append(ModelCheckpoint(dirpath=str(root / "checkpoints"), save_last=True))
    if config.get("logger") and not any(isinstance(c, TrainingSpeed) for c in given):
        given.extend(throughput_callbacks())
    given.append(ValidationScheduleCheck())
    return given
