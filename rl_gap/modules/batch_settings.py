"""Batch settings of a ranking module that are checked without importing torch.

The command line's early check (:mod:`rl_gap.training.early_checks`), the parser and
the module itself (:mod:`rl_gap.modules.split_batch`) refuse a batch split with the
same one line.
"""

from __future__ import annotations

__all__ = ["split_batch_error"]


def split_batch_error(setting: str, factor: int) -> str:
    """The one-line refusal of a setting that splits each batch into ``factor`` parts."""
    return (
        f"{setting}={factor} would split each batch into {factor} parts ranked separately "
        f"by the loss ({factor} lists of B/{factor} instead of one list of B: a different "
        f"objective than the recipe's); for the same objective on less memory set "
        f"--model.micro_batch_size M (exact gradient caching), or pass "
        f"--model.allow_split_batch true to train on split batches anyway"
    )
