"""Query-bootstrap confidence intervals of gAP and mAP, from the retrieval state."""

from __future__ import annotations

import torch
from torch import Tensor

from rl_gap.metrics.functional import ranking
from rl_gap.metrics.functional.state import RetrievalState

__all__ = ["bootstrap_statistics", "bootstrap_from_state"]


def bootstrap_statistics(state: RetrievalState, weights: Tensor) -> tuple[Tensor, Tensor]:
    """gAP and mAP of query-resampled problems: ``weights`` (S, Q) are how many
    times each query is drawn in each of S samples. Returns ``(gap (S,), map (S,))``.

    mAP is exact. gAP is exact when the state kept per-query negative counts at
    every grid value (``boot_knot_index`` = the whole grid); otherwise the global
    negative curve is rescaled by the resampled/full ratio at the nearest knot
    below (an approximation).
    """
    if state.boot_neg_ge is None or state.boot_knot_index is None:
        raise ValueError("state has no bootstrap counts: build it with bootstrap_budget > 0")
    device = state.pos_scores.device
    grid_size = state.grid.numel()
    weights = weights.to(device=device, dtype=torch.float64)
    ap, has_pos = ranking.per_query_ap(state)
    ap = torch.nan_to_num(ap, nan=0.0)
    maps = (weights * ap).sum(1) / (weights * has_pos.double()).sum(1)
    knots = state.boot_knot_index
    count = torch.zeros(weights.shape[0], grid_size, dtype=torch.float64, device=device)
    count.index_add_(1, state.pos_grid_index, weights[:, state.pos_query])
    tp = torch.flip(torch.cumsum(torch.flip(count, [1]), 1), [1])
    fp_knots = weights @ state.boot_neg_ge.double()  # (S, K)
    if knots.numel() == grid_size:
        fp = fp_knots
    else:
        full_fp = state.grid_neg_ge.sum(0).double()
        nearest = torch.searchsorted(knots, torch.arange(grid_size, device=device), right=True)
        nearest = (nearest - 1).clamp(min=0)
        fp = full_fp * ((fp_knots + 1) / (full_fp[knots] + 1))[:, nearest]
    denom = (tp + fp).clamp(min=1e-300)
    gaps = (count * tp / denom).sum(1) / count.sum(1)
    return gaps, maps


def bootstrap_from_state(
    state: RetrievalState, num_samples: int = 1000, alpha: float = 0.05, seed: int = 0
) -> dict[str, float]:
    """Percentile (1 - alpha) intervals of gAP and mAP under resampling queries
    with replacement (``bootstrap_statistics``; ``gap_ci_exact`` = 1.0 when exact)."""
    num_q, grid_size = state.num_queries, state.grid.numel()
    generator = torch.Generator().manual_seed(seed)
    chunk = max(1, min(256, (1 << 24) // max(grid_size, num_q, 1)))
    gaps, maps = [], []
    for start in range(0, num_samples, chunk):
        size = min(chunk, num_samples - start)
        draws = torch.randint(num_q, (size, num_q), generator=generator)
        weights = torch.zeros(size, num_q, dtype=torch.float64)
        weights.scatter_add_(1, draws, torch.ones_like(weights))
        gap, map_ = bootstrap_statistics(state, weights)
        gaps.append(gap.cpu())
        maps.append(map_.cpu())
    q = torch.tensor([alpha / 2, 1 - alpha / 2], dtype=torch.float64)
    gap_ci = torch.quantile(torch.nan_to_num(torch.cat(gaps)), q)
    map_ci = torch.quantile(torch.nan_to_num(torch.cat(maps)), q)
    exact = state.boot_knot_index is not None and state.boot_knot_index.numel() == grid_size
    return {
        "gap_ci_low": float(gap_ci[0]),
        "gap_ci_high": float(gap_ci[1]),
        "map_ci_low": float(map_ci[0]),
        "map_ci_high": float(map_ci[1]),
        "gap_ci_exact": float(exact),
    }
