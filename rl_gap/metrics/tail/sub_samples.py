"""What the nested sub-samples say: the sufficient-budget check, prediction curves, measured points."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rl_gap.metrics.tail.intervals import bootstrap_ci
from rl_gap.metrics.tail.registry import get_estimator

if TYPE_CHECKING:
    from rl_gap.metrics.tail.predictor import TailPredictor


def budget_check(
    predictor: TailPredictor,
    estimator: str,
    gallery_size: int,
    rank_law: str | None = None,
    n_boot: int = 1000,
    confidence: float = 0.95,
    ci: tuple[float, float] | None = None,
) -> dict:
    """Sufficient-budget diagnostic (paper App. D).

    Predictions from the nested sub-samples S/4, S/2 and S side by side;
    ``converged`` when their spread (max − min) is below the query noise, the
    half-width of the query-bootstrap interval at S.
    """
    fractions = predictor.state.fractions
    picks = [i for i, f in enumerate(fractions) if any(abs(f - g) < 1e-9 for g in (0.25, 0.5, 1.0))]
    rows = []
    for i in picks:
        n = predictor.level_size(i)
        pq = predictor.per_query(estimator, max(gallery_size, n), rank_law, level=i)
        rows.append(
            {
                "fraction": fractions[i],
                "sample_size": n,
                "map": float(pq[predictor.query_ok].mean()),
            }
        )
    if ci is None:
        # The check needs the query noise even when no interval was asked for.
        ci = bootstrap_ci(
            predictor.per_query(estimator, gallery_size, rank_law),
            max(int(n_boot), 200),
            confidence,
            predictor.generator(),
        )
    noise = (ci[1] - ci[0]) / 2.0
    maps = [r["map"] for r in rows]
    spread = max(maps) - min(maps) if maps else math.nan
    return {"levels": rows, "spread": spread, "noise": noise, "converged": bool(spread <= noise)}


def prediction_curve(
    predictor: TailPredictor,
    estimator: str,
    sizes: list[int],
    rank_law: str | None = None,
    n_boot: int = 500,
    confidence: float = 0.95,
) -> tuple[list[float], list[float], list[float]]:
    """Predicted mAP@k and interval at each gallery size (hardness computed once)."""
    est = get_estimator(estimator)
    maps, los, his = [], [], []
    for n in sizes:
        pq = predictor.per_query(est.name, int(n), rank_law)
        mean, (lo, hi) = est.point_and_interval(predictor, int(n), pq, n_boot, confidence)
        maps.append(mean)
        los.append(lo)
        his.append(hi)
    return maps, los, his


def measured_on_sub_samples(
    predictor: TailPredictor, n_boot: int = 500, confidence: float = 0.95
) -> list[dict]:
    """The metric measured on each nested sub-sample gallery (S/8 … S)."""
    out = []
    for i, f in enumerate(predictor.state.fractions):
        n = predictor.level_size(i)
        if n == 0:
            continue
        pq = predictor.per_query("sample", n, level=i)
        ci = bootstrap_ci(pq, n_boot, confidence, predictor.generator())  # None at n_boot=0
        mean = float(pq[predictor.query_ok].mean())
        out.append({"fraction": f, "sample_size": n, "map": mean, "ci": ci and list(ci)})
    return out
