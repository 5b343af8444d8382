"""The shared-threshold protocol (gSAP paper §C.3) and query-bootstrap intervals."""

from __future__ import annotations

import torch
from torch import Tensor

from rl_gap.metrics.functional import ranking
from rl_gap.metrics.functional.state import RetrievalState

__all__ = ["split_classes", "threshold_protocol_from_state", "bootstrap_from_state"]


def split_classes(labels: Tensor, seed: int = 0) -> Tensor:
    """(N,) int64: 0 for items of a random half of the classes (fit), 1 for the rest (eval)."""
    classes, inverse = torch.unique(labels.cpu(), return_inverse=True)
    generator = torch.Generator().manual_seed(seed)
    perm = torch.randperm(classes.numel(), generator=generator)
    half = torch.zeros(classes.numel(), dtype=torch.long)
    half[perm[classes.numel() // 2 :]] = 1
    return half[inverse]


def threshold_protocol_from_state(
    state: RetrievalState,
    fit_groups: list[int],
    eval_groups: list[int],
    precision: float = 0.9,
) -> dict[str, float]:
    """Fit shared thresholds on the ``fit_groups`` queries, report on ``eval_groups``.

    - ``f1g``: F1 on the eval queries at the threshold maximising fit F1;
    - ``r@p{precision}``: eval recall at the fit threshold with precision >= ``precision``;
    - ``f1q``: mean per-query best F1 over the eval queries.
    Thresholds are grid values (positive scores) so the eval counts are exact.
    """
    _, thr_f1 = ranking.global_f1_from_state(state, fit_groups)
    _, thr_p = ranking.recall_at_precision_from_state(state, precision, fit_groups)
    tp, fp, count = ranking.global_curve(state, eval_groups)
    total = float(count.sum())
    grid = state.grid.double().cpu()

    def at(threshold: Tensor) -> tuple[float, float]:
        if not torch.isfinite(threshold) or grid.numel() == 0:
            return 0.0, 0.0
        index = int(torch.searchsorted(grid, threshold.reshape(1)).item())
        return float(tp[index]), float(fp[index])

    nan = float("nan")
    tp_f1, fp_f1 = at(thr_f1)
    tp_p, _ = at(thr_p)
    mask = ranking.query_mask_for_groups(state, eval_groups)
    return {
        "f1g": 2 * tp_f1 / (tp_f1 + fp_f1 + total) if total else nan,
        f"r@p{round(precision * 100)}": tp_p / total if total else nan,
        "f1q": float(ranking.per_query_f1_from_state(state, mask)),
        "threshold_f1": float(thr_f1),
        f"threshold_p{round(precision * 100)}": float(thr_p),
    }


def bootstrap_from_state(
    state: RetrievalState, num_samples: int = 1000, alpha: float = 0.05, seed: int = 0
) -> dict[str, float]:
    """Percentile (1 - alpha) intervals of gAP and mAP under resampling queries.

    mAP resamples per-query APs (exact). gAP needs each resampled query's
    negatives >= every positive score: exact when the state kept per-query
    counts at every grid value (``boot_knot_index`` = whole grid); otherwise the
    global negative curve is rescaled by the resampled/full ratio at the
    nearest knot below (approximate; ``gap_ci_exact`` says which).
    """
    if state.boot_neg_ge is None or state.boot_knot_index is None:
        raise ValueError("state has no bootstrap counts: build it with bootstrap_budget > 0")
    device = state.pos_scores.device
    num_q, grid_size = state.num_queries, state.grid.numel()
    ap, has_pos = ranking.per_query_ap(state)
    ap = torch.nan_to_num(ap, nan=0.0)
    exact = state.boot_knot_index.numel() == grid_size
    full_fp = state.grid_neg_ge.sum(0).double()
    knots = state.boot_knot_index
    nearest = torch.searchsorted(knots, torch.arange(grid_size, device=device), right=True) - 1
    nearest = nearest.clamp(min=0)
    boot_counts = state.boot_neg_ge.double()
    generator = torch.Generator().manual_seed(seed)
    chunk = max(1, min(256, (1 << 24) // max(grid_size, num_q, 1)))
    gaps, maps = [], []
    for start in range(0, num_samples, chunk):
        size = min(chunk, num_samples - start)
        draws = torch.randint(num_q, (size, num_q), generator=generator).to(device)
        weights = torch.zeros(size, num_q, dtype=torch.float64, device=device)
        weights.scatter_add_(1, draws, torch.ones_like(weights))
        hp = has_pos.double()
        maps.append((weights * ap).sum(1) / (weights * hp).sum(1).clamp(min=1e-300))
        count = torch.zeros(size, grid_size, dtype=torch.float64, device=device)
        count.index_add_(1, state.pos_grid_index, weights[:, state.pos_query])
        tp = torch.flip(torch.cumsum(torch.flip(count, [1]), 1), [1])
        fp_knots = weights @ boot_counts  # (size, K)
        if exact:
            fp = fp_knots
        else:
            ratio = (fp_knots + 1) / (full_fp[knots] + 1)
            fp = full_fp * ratio[:, nearest]
        denom = tp + fp
        precision = torch.where(denom > 0, tp / denom.clamp(min=1e-300), torch.zeros_like(tp))
        gaps.append((count * precision).sum(1) / count.sum(1).clamp(min=1e-300))
    gap_samples, map_samples = torch.cat(gaps).cpu(), torch.cat(maps).cpu()
    q = torch.tensor([alpha / 2, 1 - alpha / 2], dtype=torch.float64)
    gap_ci, map_ci = torch.quantile(gap_samples, q), torch.quantile(map_samples, q)
    return {
        "gap_ci_low": float(gap_ci[0]),
        "gap_ci_high": float(gap_ci[1]),
        "map_ci_low": float(map_ci[0]),
        "map_ci_high": float(map_ci[1]),
        "gap_ci_exact": float(exact),
    }
