"""No silent change of objective: trainer settings that split the batch the loss ranks.

Lightning's gradient accumulation (``trainer.accumulate_grad_batches: k``, or a
``GradientAccumulationScheduler`` callback) runs the training step on k smaller batches
and sums their gradients. For a per-sample loss that is the same update; for a ranking
loss over the global batch it is not: gSAP ranks k lists of B/k instead of one list of B
(each with its own negatives, its own dropped negatives, its own normalisation), a
different objective than the recipe states. So it is refused unless the model opts in
with ``allow_split_batch: true``; ``micro_batch_size`` is the exact way to save memory.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import GradientAccumulationScheduler
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from rl_gap.modules.batch_settings import split_batch_error


def split_batch_setting(trainer: Any) -> tuple[str, int] | None:
    """The trainer's first batch-splitting setting as ``(name, factor)``, or None."""
    factor = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
    if factor > 1:
        return "trainer.accumulate_grad_batches", factor
    for callback in getattr(trainer, "callbacks", []) or []:
        if isinstance(callback, GradientAccumulationScheduler):
            most = max(callback.scheduling.values(), default=1)
            if most > 1:
                return "GradientAccumulationScheduler factor", int(most)
    return None


def check_split_batch(trainer: Any, allowed: bool) -> None:
    """Raise ``ValueError`` when the trainer splits the loss's batch and it is not allowed."""
    if allowed:
        return
    found = split_batch_setting(trainer)
    if found is not None:
        raise ValueError(split_batch_error(*found))


def warn_batchnorm(module: nn.Module) -> None:
    """Warn (once per process) that BatchNorm statistics become per micro-batch."""
    names = sorted({type(m).__name__ for m in module.modules() if isinstance(m, _BatchNorm)})
    if names:
        rank_zero_warn(
            f"micro_batch_size with BatchNorm ({', '.join(names)}): batch statistics are "
            "computed per micro-batch (as per-rank BatchNorm is per rank), so the step "
            "differs from the full-batch one; LayerNorm/GroupNorm models are exact"
        )


def batchnorm_micro_batch_error(module: nn.Module, micro_batch_size: int | None) -> str | None:
    """The refusal of ``micro_batch_size: 1`` for a model with BatchNorm, else None.

    BatchNorm cannot compute batch statistics of a single sample in training; a one-sample
    *remainder* is merged into the micro-batch before it (``grad_cache.micro_batches``), but
    micro-batches of one sample throughout cannot be repaired that way.
    """
    if micro_batch_size != 1:
        return None
    names = sorted({type(m).__name__ for m in module.modules() if isinstance(m, _BatchNorm)})
    if not names:
        return None
    return (
        f"micro_batch_size 1 with BatchNorm ({', '.join(names)}): BatchNorm cannot normalise "
        "a micro-batch of one sample in training; use micro_batch_size >= 2"
    )
