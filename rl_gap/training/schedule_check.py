"""A fit whose schedule never validates, or never computes what it monitors, says so at start-up.

``--trainer.max_epochs 1`` on a recipe that evaluates every 4 epochs trains and logs no
metric at all; a checkpoint or early stop monitoring ``val/gap`` then never sees it.
:func:`schedule_problems` names the keys involved (pure: numbers in, messages out);
:class:`ValidationScheduleCheck` (added by ``rl-gap fit``) warns with them before the first
step, when the number of batches per epoch is known.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import lightning as L
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint


def validation_epochs(
    max_epochs: int | None, every_n_epochs: int | None, val_check_interval: float | int | None
) -> tuple[int, int | None]:
    """(number of epochs that validate, last such epoch, 1-based) under an epoch budget.

    ``val_check_interval`` below one epoch (a float < 1 or a batch count) validates within
    every epoch that validates at all; ``every_n_epochs=None`` validates only by steps.
    """
    if max_epochs is None or max_epochs < 0:
        return math.inf, None  # unbounded: some epoch validates
    if every_n_epochs is None:
        return (max_epochs, max_epochs) if val_check_interval is not None else (0, None)
    count = max_epochs // every_n_epochs
    return count, (count * every_n_epochs if count else None)


def schedule_problems(
    *,
    max_epochs: int | None,
    max_steps: int,
    every_n_epochs: int | None,
    val_check_interval: float | int | None,
    limit_val_batches: float | int | None,
    batches_per_epoch: float | int,
    has_val_data: bool,
    monitors: Sequence[str] = (),
) -> list[str]:
    """Messages naming the keys of a schedule that never validates or ends unvalidated."""
    if not has_val_data:
        return []
    if limit_val_batches == 0:
        return ["trainer.limit_val_batches=0: this fit never validates" + _monitored(monitors)]
    epochs = max_epochs
    if max_steps is not None and max_steps > 0 and math.isfinite(batches_per_epoch):
        by_steps = math.ceil(max_steps / max(1, batches_per_epoch))
        epochs = by_steps if epochs is None or epochs < 0 else min(epochs, by_steps)
    count, last = validation_epochs(epochs, every_n_epochs, val_check_interval)
    budget = f"trainer.max_epochs={max_epochs}" + (
        f", trainer.max_steps={max_steps}" if max_steps is not None and max_steps > 0 else ""
    )
    if count == 0:
        return [
            f"{budget} with trainer.check_val_every_n_epoch={every_n_epochs}: this fit never "
            f"validates, so no val/* metric is logged" + _monitored(monitors)
            + f"; set --trainer.check_val_every_n_epoch to at most {epochs}"
        ]  # fmt: skip
    if last is not None and epochs is not None and 0 < last < epochs:
        return [
            f"{budget} with trainer.check_val_every_n_epoch={every_n_epochs}: the last "
            f"validation is at epoch {last} of {epochs}; the final model is never evaluated"
        ]
    return []


def _monitored(monitors: Sequence[str]) -> str:
    if not monitors:
        return ""
    return f" and the monitored {', '.join(sorted(set(monitors)))} is never computed"


class ValidationScheduleCheck(Callback):
    """Warns before the first step when the fit's schedule never validates (module docstring)."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        monitors = [
            cb.monitor
            for cb in trainer.callbacks
            if isinstance(cb, (ModelCheckpoint, EarlyStopping)) and getattr(cb, "monitor", None)
        ]
        self.problems = schedule_problems(
            max_epochs=trainer.max_epochs,
            max_steps=trainer.max_steps,
            every_n_epochs=trainer.check_val_every_n_epoch,
            val_check_interval=_interval(trainer),
            limit_val_batches=trainer.limit_val_batches,
            batches_per_epoch=trainer.num_training_batches,
            has_val_data=_has_validation(trainer, pl_module),
            monitors=monitors,
        )
        if trainer.is_global_zero:
            for problem in self.problems:
                warnings.warn(problem, UserWarning, stacklevel=2)


def _has_validation(trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
    """A validation step and a validation loader (as Lightning decides whether to validate)."""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    if not is_overridden("validation_step", pl_module):
        return False
    source = getattr(trainer.fit_loop.epoch_loop.val_loop, "_data_source", None)
    return source is None or source.is_defined()


def _interval(trainer: L.Trainer) -> float | int | None:
    value = trainer.val_check_interval
    return None if value == 1.0 and isinstance(value, float) else value
