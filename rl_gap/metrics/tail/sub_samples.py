"""What the nested sub-samples say: the metric measured on them, and the sufficient-budget check."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from rl_gap.metrics.tail.hardness import sample_counts
from rl_gap.metrics.tail.inputs import EstimateRequest
from rl_gap.metrics.tail.intervals import check_n_boot, query_bootstrap
from rl_gap.metrics.tail.rank_law import ap_at_k_from_counts
from rl_gap.metrics.tail.registry import Estimator, get_estimator

if TYPE_CHECKING:
    from rl_gap.metrics.tail.view import RowsView, TailView


def measured_ap(
    view: RowsView, level: int = -1, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """(Q,) AP@k measured on nested sub-sample ``level`` as the gallery (N = its size); NaN for
    queries without positives. A block of rows at a time when they are many.

    Args:
        view: the prediction's rows.
        level: nested sub-sample index (-1: the full sample).
        weight: optional (Q, T) multiplicities of the kept scores (bootstrap).
    """
    views = view.row_views()
    if views is not None:
        return torch.cat([measured_ap(v, level, v.weight(weight)) for v in views])
    top, _ = view.level(level)
    counts, _ = sample_counts(view.pos_sorted, view.valid, top, weight)
    ap = ap_at_k_from_counts(view.j, view.valid, counts, view.k)
    return torch.where(view.query_ok, ap, torch.full_like(ap, math.nan))


def budget_check(
    view: TailView,
    estimator: str | Estimator,
    gallery_size: int,
    rank_law: str | None = None,
    n_boot: int = EstimateRequest.n_boot,
    confidence: float = EstimateRequest.confidence,
    ci: tuple[float, float] | None = None,
) -> dict:
    """Sufficient-budget diagnostic (paper App. D).

    Predictions from the nested sub-samples S/4, S/2 and S side by side;
    ``converged`` when their spread (max − min) is below the query noise, the
    half-width of the query-bootstrap interval at S (``ci``, else ``max(n_boot, 200)``
    replicates of its own). ``estimator``: a registered name or the estimator.
    """
    estimator = get_estimator(estimator)
    fractions = view.fractions
    picks = [i for i, f in enumerate(fractions) if any(abs(f - g) < 1e-9 for g in (0.25, 0.5, 1.0))]
    rows = []
    for i in picks:
        n = view.level_size(i)
        pq = estimator.ap(view, max(gallery_size, n), rank_law, level=i)
        rows.append(
            {"fraction": fractions[i], "sample_size": n, "map": float(pq[view.query_ok].mean())}
        )
    if ci is None:
        # The check needs the query noise even when no interval was asked for.
        ci = query_bootstrap(
            estimator.ap(view, gallery_size, rank_law),
            max(int(n_boot), 200),
            confidence,
            view.generator(),
        )
    noise = (ci[1] - ci[0]) / 2.0
    maps = [r["map"] for r in rows]
    spread = max(maps) - min(maps) if maps else math.nan
    return {"levels": rows, "spread": spread, "noise": noise, "converged": bool(spread <= noise)}


def measured_on_sub_samples(
    view: TailView, n_boot: int = 500, confidence: float = 0.95
) -> list[dict]:
    """The metric measured on each nested sub-sample gallery (S/8 … S), with its query-bootstrap
    interval (None at ``n_boot=0``)."""
    check_n_boot(n_boot)
    out = []
    for i, f in enumerate(view.fractions):
        n = view.level_size(i)
        if n == 0:
            continue
        pq = measured_ap(view, i)
        ci = query_bootstrap(pq, n_boot, confidence, view.generator())
        mean = float(pq[view.query_ok].mean())
        out.append({"fraction": f, "sample_size": n, "map": mean, "ci": ci and list(ci)})
    return out
