"""Retrieval state from a materialised score matrix ``(scores, rel, valid)``."""

from __future__ import annotations

import torch
from torch import Tensor

from rl_gap.metrics.functional.counting import NegativeCounter
from rl_gap.metrics.functional.state import (
    RetrievalState,
    argsort_stable,
    compute_dtype_for,
    torch_threads,
    unique_sorted,
)

__all__ = [
    "state_from_scores",
    "check_matrix_inputs",
    "prepare_positives",
    "merge_grid",
    "bootstrap_knots",
]

_DENSE_BLOCK = 1 << 22  # pairs per counting block


def check_matrix_inputs(
    scores: Tensor, rel: Tensor, valid: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Validate and normalise ``(scores, rel, valid)`` to 2-D tensors.

    1-D inputs are one query. ``rel``/``valid`` may be bool or 0/1 integers.
    Raises ``ValueError`` naming the problem (type, shape, dtype, NaN/inf, empty).
    """
    if not isinstance(scores, Tensor) or not isinstance(rel, Tensor):
        raise ValueError("scores and rel must be torch tensors")
    if valid is not None and not isinstance(valid, Tensor):
        raise ValueError(
            f"valid must be a (Q, D) bool tensor or None, got {type(valid).__name__} {valid!r} "
            "(cut-offs are keyword arguments: mean_ap(scores, rel, k=5))"
        )
    if scores.ndim == 1:
        scores, rel = scores.unsqueeze(0), rel.unsqueeze(0) if rel.ndim == 1 else rel
        valid = valid.unsqueeze(0) if valid is not None and valid.ndim == 1 else valid
    if scores.ndim != 2:
        raise ValueError(f"scores must be (Q, D) or (D,), got shape {tuple(scores.shape)}")
    if not scores.dtype.is_floating_point:
        raise ValueError(f"scores must be floating point, got dtype {scores.dtype}")
    if scores.shape[0] == 0 or scores.shape[1] == 0:
        raise ValueError(f"empty query or database set: scores shape {tuple(scores.shape)}")

    def as_bool(mask: Tensor, name: str) -> Tensor:
        if mask.shape != scores.shape:
            raise ValueError(
                f"{name} shape {tuple(mask.shape)} does not match scores {tuple(scores.shape)}"
            )
        if mask.dtype == torch.bool:
            return mask
        if mask.dtype.is_floating_point or mask.dtype.is_complex:
            raise ValueError(f"{name} must be bool (or 0/1 integers), got dtype {mask.dtype}")
        if bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError(f"{name} holds values other than 0/1")
        return mask.bool()

    rel = as_bool(rel, "rel")
    valid = torch.ones_like(rel) if valid is None else as_bool(valid, "valid")
    if not bool(torch.isfinite(scores[valid]).all()):
        raise ValueError("scores contain NaN or inf at valid pairs")
    return scores, rel, valid


def prepare_positives(
    pos_query: Tensor, pos_scores: Tensor, num_queries: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Order positives by query then decreasing score, and build the grid.

    Returns ``(order, pos_query, pos_scores, offsets (Q+1,), grid (G,), pos_grid_index)``
    where ``order`` permutes the inputs into the returned order.
    """
    order = argsort_stable(pos_scores, descending=True)
    order = order[argsort_stable(pos_query[order])]
    pos_query, pos_scores = pos_query[order], pos_scores[order]
    counts = torch.bincount(pos_query, minlength=num_queries)
    offsets = torch.zeros(num_queries + 1, dtype=torch.long, device=pos_query.device)
    offsets[1:] = torch.cumsum(counts, 0)
    grid, pos_grid_index = unique_sorted(pos_scores, return_inverse=True)
    return order, pos_query, pos_scores, offsets, grid, pos_grid_index


def merge_grid(grid: Tensor, pos_grid_index: Tensor, extra: Tensor) -> tuple[Tensor, Tensor]:
    """Add ``extra`` finite values (e.g. thresholds fitted elsewhere) to the grid, so
    the negatives counted at each of them are exact. Grid values without a positive
    add nothing to gAP/R@P/F1 (they weigh by the positives at a value).

    Returns the new ascending distinct grid and the positives' positions in it.
    """
    extra = extra.to(device=grid.device, dtype=grid.dtype).reshape(-1)
    extra = extra[torch.isfinite(extra)]
    if extra.numel() == 0:
        return grid, pos_grid_index
    merged = unique_sorted(torch.cat([grid, extra]))
    return merged, torch.searchsorted(merged, grid)[pos_grid_index]


def bootstrap_knots(
    pos_grid_index: Tensor, grid_size: int, num_queries: int, budget: int
) -> Tensor:
    """Grid positions where per-query negative counts are kept for the gAP bootstrap:
    every grid value when ``Q·G <= budget`` (exact bootstrap), else ``budget // Q``
    positions at quantiles of the positive scores."""
    if grid_size * num_queries <= budget:
        return torch.arange(grid_size, device=pos_grid_index.device)
    count = max(1, budget // max(num_queries, 1))
    sorted_idx = pos_grid_index[argsort_stable(pos_grid_index)]
    picks = torch.linspace(0, sorted_idx.numel() - 1, count, device=sorted_idx.device)
    return unique_sorted(sorted_idx[picks.round().long()])


def state_from_scores(
    scores: Tensor,
    rel: Tensor,
    valid: Tensor | None = None,
    query_group: Tensor | None = None,
    num_groups: int = 1,
    bootstrap_budget: int = 0,
    extra_grid: Tensor | None = None,
) -> RetrievalState:
    """Exact retrieval state of a materialised matrix (bookkeeping on one CPU thread,
    counting with torch's configured threads).

    Args:
        scores: (Q, D) similarities; float64 stays float64, other floats -> float32.
        rel: (Q, D) bool, True = relevant pair.
        valid: optional (Q, D) bool, False = pair ignored entirely.
        query_group: optional (Q,) int64 group per query (e.g. threshold-protocol halves).
        num_groups: number of query groups.
        bootstrap_budget: entries of per-query knot counts to keep for the gAP
            bootstrap (0: none).
        extra_grid: optional scores added to the grid (``merge_grid``): negatives are
            counted exactly at each (the threshold protocol's fitted thresholds).
    """
    heavy_threads = torch.get_num_threads()
    with torch_threads(1):
        return _dense_state(
            scores, rel, valid, query_group, num_groups, bootstrap_budget, extra_grid,
            heavy_threads,
        )  # fmt: skip


def _dense_state(
    scores, rel, valid, query_group, num_groups, bootstrap_budget, extra_grid, heavy_threads
) -> RetrievalState:
    scores, rel, valid = check_matrix_inputs(scores, rel, valid)
    scores = scores.to(compute_dtype_for(scores.dtype))
    num_queries = scores.shape[0]
    device = scores.device
    if query_group is None:
        query_group = torch.zeros(num_queries, dtype=torch.long, device=device)
    positive = rel & valid
    q_idx, d_idx = positive.nonzero(as_tuple=True)
    _, pos_query, pos_scores, offsets, grid, pos_grid_index = prepare_positives(
        q_idx, scores[q_idx, d_idx], num_queries
    )
    if extra_grid is not None:
        grid, pos_grid_index = merge_grid(grid, pos_grid_index, extra_grid)
    num_negatives = (valid & ~rel).sum(1)
    if grid.numel() == 0:
        groups = torch.zeros((num_groups, 0), dtype=torch.long, device=device)
        return RetrievalState(
            num_queries, pos_scores, pos_query, torch.zeros_like(pos_query), grid,
            pos_grid_index, groups, query_group, num_negatives,
        )  # fmt: skip
    knots = None
    if bootstrap_budget > 0:
        knots = bootstrap_knots(pos_grid_index, grid.numel(), num_queries, bootstrap_budget)
    counter = NegativeCounter(grid, offsets, pos_grid_index, query_group, num_groups, knots)
    negatives = scores.masked_fill(~(valid & ~rel), float("-inf"))
    rows_per_block = max(1, _DENSE_BLOCK // scores.shape[1])
    for start in range(0, num_queries, rows_per_block):
        stop = min(num_queries, start + rows_per_block)
        with torch_threads(heavy_threads):
            counter.add(negatives[start:stop], start)
    pos_neg_ge, grid_neg_ge, boot = counter.finish()
    return RetrievalState(
        num_queries, pos_scores, pos_query, pos_neg_ge, grid, pos_grid_index, grid_neg_ge,
        query_group, num_negatives, knots, boot,
    )  # fmt: skip
