"""Partial sums of the sharded losses: each rank's rows are complete, only scalars cross.

Per-row losses (mSAP, SoftBin, BlackBox, SupAP; InfoNCE rows; SigLIP) sum
their rows on each rank; the partial sums and the number of rows with a
positive are all-reduced (a few scalars). The global losses rank the flat list
concatenated over ranks: :func:`kept_flat` gives this rank's part of it after
global negative dropping (``rl_gap.losses.sharding.drop``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rl_gap import dist as shard_comm
from rl_gap.losses.common import compute_dtype, drop_lowest_negatives
from rl_gap.losses.sharding.drop import sharded_drop_mask


def no_positive(rel: torch.Tensor, valid: torch.Tensor) -> bool:
    """Whether no rank holds a valid positive pair (every rank calls it)."""
    local = int(torch.count_nonzero(rel & valid))
    return shard_comm.global_count(local, rel.device) == 0


def mean_over_ranks(partial: torch.Tensor, count: int) -> torch.Tensor:
    """The sum of every rank's ``partial`` (gradient to each rank's share) divided by ``count``."""
    return shard_comm.reduce_partials(partial) / count


def row_mean(
    sim: torch.Tensor,
    rel: torch.Tensor,
    valid: torch.Tensor,
    per_rows: Callable[..., torch.Tensor],
    neg_drop: float,
) -> torch.Tensor:
    """Mean over the global rows with a valid positive of a per-row surrogate.

    ``per_rows(sim, rel, valid, has_pos)`` returns the (R',) values of this
    rank's rows with a positive (``has_pos``), after each row's negative
    dropping (``neg_drop``; rows are complete on a rank, so per-row dropping is local).
    """
    has_pos = (rel & valid).any(1)
    count = shard_comm.global_count(int(torch.count_nonzero(has_pos)), sim.device)
    valid = drop_lowest_negatives(sim, rel, valid, neg_drop)
    if bool(has_pos.any()):
        partial = per_rows(sim, rel, valid, has_pos).sum()
    else:
        partial = sim.sum().to(compute_dtype(sim.dtype)) * 0.0
    return mean_over_ranks(partial, count)


def kept_flat(
    sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor, neg_drop: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's part of the flattened valid list after global negative dropping."""
    scores, positive = sim[valid], rel[valid]
    if neg_drop > 0:
        keep = sharded_drop_mask(scores, positive, None, neg_drop)
        scores, positive = scores[keep], positive[keep]
    return scores, positive
