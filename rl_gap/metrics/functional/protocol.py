"""The shared-threshold protocol (gSAP paper §C.3)."""

from __future__ import annotations

import torch
from torch import Tensor

from rl_gap.metrics.functional import ranking
from rl_gap.metrics.functional.state import RetrievalState

__all__ = ["split_classes", "threshold_protocol_from_state"]


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
