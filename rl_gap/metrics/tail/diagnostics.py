"""When the sample cannot support a tail prediction: diagnostics and the threshold interval.

A GPD tail extrapolation rests on a choice the sample does not pin down: how
deep the threshold sits (how many exceedances are fitted). Where the tail's
shape changes with depth (tight clusters, near-duplicate bumps, mixtures), fits
at different depths carry different shapes 20× past the sample maximum and
the prediction depends on that choice. Two checks, both computed from the
sample alone:

- **threshold stability**: the paper's plug-in GPD (``evt``) refitted with the
  top n ∈ :data:`THRESHOLD_EXCESSES` exceedances; the spread (max − min) of
  the predicted mAP@k over n, and the fitted shape's median ξ at the shallowest
  and deepest threshold;
- **sufficient budget** (paper App. D): the prediction from the nested
  sub-samples S/4, S/2 and S; not converged when the spread exceeds the
  query noise (half-width of the query-bootstrap interval).

:func:`diagnose` turns them into ``flags`` (empty = supported) with the reasons,
and :meth:`Diagnostics.widen` adds the threshold spread to a sampling interval,
so that the interval also carries the model-choice uncertainty.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from rl_gap.metrics.tail.hardness import sample_excesses
from rl_gap.metrics.tail.rank_law import ap_at_k_from_hardness
from rl_gap.metrics.tail.registry import THRESHOLD_EXCESSES, Estimator, get_estimator
from rl_gap.metrics.tail.results import Diagnostics
from rl_gap.metrics.tail.rows import concat_rows
from rl_gap.metrics.tail.sub_samples import budget_check
from rl_gap.metrics.tail.view import RowsView, TailView

#: Flag when the predicted mAP@k moves by more than this over the thresholds.
THRESHOLD_TOLERANCE = 0.03
#: Flag when the median fitted shape moves by more than this between 25 and 400 exceedances.
SHAPE_TOLERANCE = 0.5
#: Fewest exceedances a threshold check refits.
MIN_EXCESSES = 10
#: Flag when more than this share of queries has a top score apart from its tail (1% by chance).
OUTLIER_SHARE = 0.05


def refit_at(view: TailView, n_excess: int, estimator: str | Estimator = "evt"):
    """(hardness, TailFit) of a plug-in GPD estimator (``evt``, ``evt_support``) refitted to
    ``n_excess`` exceedances of the full sample, kept for the prediction."""
    est = get_estimator(estimator)
    return view.memo(("refit", est.name, n_excess), lambda: _refit(view, n_excess, est))


def _refit(rows: RowsView, n_excess: int, estimator: Estimator):
    """(hardness, TailFit) of the GPD refitted to ``n_excess`` exceedances, on a view's rows."""
    top, n = rows.level(-1)
    config = dataclasses.replace(rows.config, n_excess=n_excess)
    x, _, fit = estimator.estimate_hardness(rows.pos_sorted, rows.valid, top, n, None, config)
    return x, fit


def _fit_at(view: TailView, n_excess: int, estimator: Estimator):
    """The TailFit of :func:`refit_at`, a block of queries at a time when they are many."""
    views = view.row_views()
    if views is None:
        return refit_at(view, n_excess, estimator)[1]
    return view.memo(
        ("refit fit", estimator.name, n_excess),
        lambda: concat_rows([_refit(v, n_excess, estimator)[1] for v in views]),
    )


def threshold_predictions(
    view: TailView,
    gallery_size: int,
    excesses: tuple[int, ...] = THRESHOLD_EXCESSES,
    combine=None,
    estimator: str | Estimator = "evt",
):
    """Per-query AP@k (plug-in ranks) of a plug-in GPD refitted at each exceedance count.

    Args:
        view: a prediction's data (a ``TailPredictor``).
        gallery_size: N.
        excesses: exceedance counts n (the threshold is the (n+1)-th largest score).
        combine: None → {n: (Q,) per-query AP}; "min" → (Q,) per-query AP at each
            positive's smallest hardness over the fits.
        estimator: the refitted plug-in GPD (``evt`` or ``evt_support``, or its object).
    """
    if combine not in (None, "min"):
        raise ValueError(f"unknown combine {combine!r}; known: None, 'min'")
    est = get_estimator(estimator)
    views = view.row_views()
    if views is not None:  # many queries × positives: a block of rows at a time
        parts = [_threshold_aps(v, gallery_size, excesses, combine, est) for v in views]
        return (
            concat_rows(parts)
            if combine
            else {n: concat_rows([p[n] for p in parts]) for n in excesses}
        )
    xs = {n: refit_at(view, n, est)[0] for n in excesses}
    return _aps(view, xs, gallery_size, combine)


def _threshold_aps(rows, gallery_size, excesses, combine, estimator):
    xs = {n: _refit(rows, n, estimator)[0] for n in excesses}
    return _aps(rows, xs, gallery_size, combine)


def _aps(rows, xs: dict, gallery_size: int, combine):
    args = (rows.j, rows.valid)
    if combine == "min":
        x = torch.stack(list(xs.values())).amin(0)
        return ap_at_k_from_hardness(*args, x, gallery_size, rows.k, "plugin")
    return {
        n: ap_at_k_from_hardness(*args, x, gallery_size, rows.k, "plugin") for n, x in xs.items()
    }


def diagnose(
    view: TailView,
    gallery_size: int,
    estimator: str | Estimator = "evt",
    rank_law: str | None = None,
    per_thr: dict | None = None,
    ci: tuple[float, float] | None = None,
    budget: dict | None = None,
) -> Diagnostics:
    """Threshold-stability and sufficient-budget checks of a prediction (module docstring).

    Args:
        view: a prediction's data (a ``TailPredictor``).
        gallery_size: N.
        estimator, rank_law: the estimator checked (a name or the object): its budget check, and for the GPD
            estimators (``evt``, ``evt_support``) the threshold refits; ``count`` has
            no threshold to check.
        per_thr: :func:`threshold_predictions` output, if already computed.
        ci: the estimate's query-bootstrap interval (for the budget's noise).
        budget: the budget check's dict, if already computed.
    """
    out = Diagnostics()
    est = get_estimator(estimator)
    if budget is None:
        budget = budget_check(view, est, gallery_size, rank_law, n_boot=200, ci=ci)
    est.check_threshold(view, gallery_size, budget["noise"], per_thr, out)
    out.budget_spread, out.budget_noise = budget["spread"], budget["noise"]
    if not budget["converged"]:
        out.flags.append(
            f"budget not converged: S/4 · S/2 · S predictions spread {budget['spread']:.3f} "
            f"> query noise {budget['noise']:.3f}"
        )
    return out


def sample_thresholds(n_sample: int, config) -> tuple[int, ...]:
    """Exceedance counts ``evt_support``'s threshold check refits: half, once and twice its own."""
    n = sample_excesses(n_sample, config)
    return tuple(sorted({max(MIN_EXCESSES, n // 2), max(MIN_EXCESSES, n), 2 * n}))


def check_sample_thresholds(
    view: TailView, gallery_size: int, noise: float, out: Diagnostics, refit: Estimator
) -> None:
    """``evt_support`` (``refit``): flag a prediction that moves with the threshold by more
    than its query noise, and a sample whose top scores the fitted tail cannot produce."""
    rows = view.query_ok
    _, n_sample = view.level(-1)
    excesses = sample_thresholds(n_sample, view.config)
    per_thr = threshold_predictions(view, gallery_size, excesses, estimator=refit)
    maps = {n: float(v[rows].mean()) for n, v in per_thr.items()}
    out.threshold_maps = maps
    out.threshold_spread = max(maps.values()) - min(maps.values())
    own = maps[max(MIN_EXCESSES, sample_excesses(n_sample, view.config))]
    moved = max(abs(v - own) for v in maps.values())
    if moved > noise:
        out.flags.append(
            f"threshold-unstable: mAP@{view.k} moves by {moved:.3f} between "
            f"{min(maps)} and {max(maps)} exceedances (query noise {noise:.3f})"
        )
    check_bump(
        out, view, gallery_size,
        lambda share, bound: f"bump above the tail: {share:.0%} of queries have a sampled score "
        "the fitted tail makes improbable (rare near-copies? the pool holds N/S times more); "
        f"if every query had them above its positives: mAP@{view.k} {bound:.3f}",
        lambda: refit.bump_hardness(view),
    )  # fmt: skip


def check_bump(
    out: Diagnostics,
    view: TailView,
    gallery_size: int,
    describe: Callable[[float, float], str],
    hardness: Callable[[], torch.Tensor],
) -> None:
    """Record the share of queries whose top sampled score stands apart from their tail, and
    when it passes ``OUTLIER_SHARE`` flag it with ``describe(share, bound)``, ``bound`` the
    mAP@k of :func:`bump_bound` on ``hardness()`` (each estimator words the flag its own way
    and names the hardness a bump raises)."""
    share = tail_outlier_share(view)
    out.outlier_share = share
    if share > OUTLIER_SHARE:
        out.bump_bound = bump_bound(view, gallery_size, share, hardness())
        out.flags.append(describe(share, out.bump_bound))


def bump_bound(view: TailView, gallery_size: int, share: float, x: torch.Tensor) -> float:
    """mAP@k if every query had the bump: each positive's hardness ``x`` (Q, m) raised by the
    pooled rate of outlying top scores (``share`` of the queries, one each in S), a lower
    bound when the copies outrank every positive."""
    n_sample = view.level_size(-1)
    aps = []
    for v in view.row_views() or [view]:
        rows = x[v.rows] if v is not view else x
        raised = torch.where(v.valid, rows + share / n_sample, rows)
        aps.append(ap_at_k_from_hardness(v.j, v.valid, raised, gallery_size, v.k, "plugin"))
    return float(torch.cat(aps)[view.query_ok].mean())


def tail_outlier_share(view: TailView, n_spacings: int = 20) -> float:
    """Share of queries whose top sampled score stands apart from the rest of their tail.

    Near the top of a GPD tail with ξ ≤ 0 the normalised spacings i·(s_(i) − s_(i+1))
    are at most exponential with a common mean; the top one exceeding
    −log(0.01) ≈ 4.6 times the mean of the next ``n_spacings`` has < 1% chance
    (less for bounded tails). A share of such queries well above 1% is a bump of
    rare near-copies above the tail, which a sample holds a few of and the pool
    N/S times more.
    """
    top, _ = view.level(-1)
    m = min(n_spacings + 1, top.shape[1] - 1)
    if m < 3:
        return 0.0
    head = top[:, : m + 1].to(torch.float64)
    gaps = head[:, :-1] - head[:, 1:]  # D_1 … D_m
    weights = torch.arange(2, m + 1, dtype=torch.float64)
    scale = (gaps[:, 1:] * weights).mean(1)
    rows = view.query_ok & torch.isfinite(head).all(1) & (scale > 0)
    if not bool(rows.any()):
        return 0.0
    apart = gaps[:, 0] > -math.log(0.01) * scale
    return float(apart[rows].double().mean())


def check_fixed_thresholds(
    view: TailView, gallery_size: int, refit: Estimator, per_thr, out: Diagnostics
) -> None:
    """Fill ``out``'s threshold maps, spread and shape shift of ``refit`` (``evt``), and flag an
    unstable threshold."""
    rows = view.query_ok
    per_thr = per_thr or threshold_predictions(view, gallery_size, estimator=refit)
    maps = {n: float(v[rows].mean()) for n, v in per_thr.items()}
    out.threshold_maps = maps
    out.threshold_spread = max(maps.values()) - min(maps.values())
    shallow, deep = min(per_thr), max(per_thr)
    xi = {}
    for n in (shallow, deep):
        fit = _fit_at(view, n, refit)
        ok = fit.ok & rows
        xi[n] = float(fit.xi[ok].median()) if bool(ok.any()) else float("nan")
    out.shape_shift = xi[deep] - xi[shallow]
    if out.threshold_spread > THRESHOLD_TOLERANCE:
        out.flags.append(
            f"threshold-unstable: mAP@{view.k} moves by {out.threshold_spread:.3f} between "
            f"{shallow} and {deep} exceedances"
        )
    if abs(out.shape_shift) > SHAPE_TOLERANCE:
        out.flags.append(
            f"shape-unstable: median fitted ξ {xi[shallow]:+.2f} at {shallow} vs {xi[deep]:+.2f} "
            f"at {deep} exceedances"
        )
