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
from dataclasses import dataclass, field

import torch

from rl_gap.metrics.tail.hardness import estimate_hardness, sample_excesses
from rl_gap.metrics.tail.rank_law import ap_at_k_from_hardness
from rl_gap.metrics.tail.registry import THRESHOLD_EXCESSES, get_estimator
from rl_gap.metrics.tail.rows import concat_rows

#: Flag when the predicted mAP@k moves by more than this over the thresholds.
THRESHOLD_TOLERANCE = 0.03
#: Flag when the median fitted shape moves by more than this between 25 and 400 exceedances.
SHAPE_TOLERANCE = 0.5
#: Fewest exceedances a threshold check refits.
MIN_EXCESSES = 10
#: Flag when more than this share of queries has a top score apart from its tail (1% by chance).
OUTLIER_SHARE = 0.05


@dataclass
class Diagnostics:
    """What the sample can and cannot support about a prediction.

    Attributes:
        flags: one line per failed check (empty: supported).
        threshold_maps: {n: mAP@k of ``evt`` fitted to n exceedances}.
        threshold_spread: max − min of ``threshold_maps``.
        shape_shift: median ξ at the deepest minus the shallowest threshold.
        budget_spread, budget_noise: the sufficient-budget check's spread and noise
            (NaN when not run).
    """

    flags: list[str] = field(default_factory=list)
    threshold_maps: dict[int, float] = field(default_factory=dict)
    threshold_spread: float = float("nan")
    shape_shift: float = float("nan")
    budget_spread: float = float("nan")
    budget_noise: float = float("nan")
    outlier_share: float = float("nan")
    bump_bound: float | None = None

    @property
    def supported(self) -> bool:
        return not self.flags

    def widen(self, ci: tuple[float, float] | None) -> tuple[float, float] | None:
        """``ci`` extended to cover every threshold's prediction ± the interval's own widths,
        and down to ``bump_bound`` when set (None without an interval)."""
        if ci is None or not self.threshold_maps:
            return ci
        lo_t, hi_t = min(self.threshold_maps.values()), max(self.threshold_maps.values())
        centre = 0.5 * (ci[0] + ci[1])
        lo, hi = min(ci[0], lo_t - (centre - ci[0])), max(ci[1], hi_t + (ci[1] - centre))
        # A bump above the tail: down to the mAP if every query had it.
        return (lo if self.bump_bound is None else min(lo, self.bump_bound), hi)

    def widen_to_bump(self, ci: tuple[float, float] | None) -> tuple[float, float] | None:
        """``ci`` extended down to ``bump_bound`` when set."""
        if ci is None or self.bump_bound is None:
            return ci
        return (min(ci[0], self.bump_bound), ci[1])

    def as_dict(self) -> dict:
        return {
            "flags": list(self.flags),
            "supported": self.supported,
            "threshold_maps": {str(n): v for n, v in self.threshold_maps.items()},
            "threshold_spread": self.threshold_spread,
            "shape_shift": self.shape_shift,
            "budget_spread": self.budget_spread,
            "budget_noise": self.budget_noise,
            "outlier_share": self.outlier_share,
            "bump_bound": self.bump_bound,
        }


def _evt_at(predictor, n_excess: int, estimator: str = "evt"):
    """(hardness, TailFit) of ``estimator`` (evt or evt_support) fitted to ``n_excess``
    exceedances of the full sample."""
    cache = predictor.__dict__.setdefault("_evt_by_excess", {})
    if (estimator, n_excess) not in cache:
        cache[(estimator, n_excess)] = _refit(predictor, n_excess, estimator)
    return cache[(estimator, n_excess)]


def _refit(rows, n_excess: int, estimator: str):
    """(hardness, TailFit) of the GPD refitted to ``n_excess`` exceedances, on a predictor's rows."""
    top, n = rows.level(-1)
    config = dataclasses.replace(rows.config, n_excess=n_excess)
    x, _, fit = estimate_hardness(estimator, rows.pos_sorted, rows.valid, top, n, None, config)
    return x, fit


def _fit_at(predictor, n_excess: int, estimator: str):
    """The TailFit of :func:`_evt_at`, a block of queries at a time when they are many."""
    views = predictor.row_views()
    if views is None:
        return _evt_at(predictor, n_excess, estimator)[1]
    cache = predictor.__dict__.setdefault("_fit_by_excess", {})
    if (estimator, n_excess) not in cache:
        cache[(estimator, n_excess)] = concat_rows(
            [_refit(v, n_excess, estimator)[1] for v in views]
        )
    return cache[(estimator, n_excess)]


def threshold_predictions(
    predictor,
    gallery_size: int,
    excesses: tuple[int, ...] = THRESHOLD_EXCESSES,
    combine=None,
    estimator: str = "evt",
):
    """Per-query AP@k (plug-in ranks) of ``evt`` refitted at each exceedance count.

    Args:
        predictor: a ``TailPredictor``.
        gallery_size: N.
        excesses: exceedance counts n (the threshold is the (n+1)-th largest score).
        combine: None → {n: (Q,) per-query AP}; "min" → (Q,) per-query AP at each
            positive's smallest hardness over the fits.
        estimator: "evt" or "evt_support" (the refitted plug-in GPD).
    """
    if combine not in (None, "min"):
        raise ValueError(f"unknown combine {combine!r}; known: None, 'min'")
    views = predictor.row_views()
    if views is not None:  # many queries × positives: a block of rows at a time
        parts = [_threshold_aps(v, gallery_size, excesses, combine, estimator) for v in views]
        return (
            concat_rows(parts)
            if combine
            else {n: concat_rows([p[n] for p in parts]) for n in excesses}
        )
    xs = {n: _evt_at(predictor, n, estimator)[0] for n in excesses}
    return _aps(predictor, xs, gallery_size, combine)


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
    predictor,
    gallery_size: int,
    estimator: str = "evt",
    rank_law: str | None = None,
    per_thr: dict | None = None,
    ci: tuple[float, float] | None = None,
    budget: dict | None = None,
) -> Diagnostics:
    """Threshold-stability and sufficient-budget checks of a prediction (module docstring).

    Args:
        predictor: a ``TailPredictor``.
        gallery_size: N.
        estimator, rank_law: the estimator checked: its budget check, and for the GPD
            estimators (``evt``, ``evt_support``) the threshold refits; ``count`` has
            no threshold to check.
        per_thr: :func:`threshold_predictions` output, if already computed.
        ci: the estimate's query-bootstrap interval (for the budget's noise).
        budget: the budget check's dict, if already computed.
    """
    out = Diagnostics()
    if budget is None:
        budget = predictor.budget(estimator, gallery_size, rank_law, n_boot=200, ci=ci)
    get_estimator(estimator).check_threshold(predictor, gallery_size, budget["noise"], per_thr, out)
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


def check_sample_thresholds(predictor, gallery_size: int, noise: float, out: Diagnostics) -> None:
    """``evt_support``: flag a prediction that moves with the threshold by more than its
    query noise, and a sample whose top scores the fitted tail cannot produce."""
    rows = predictor.query_ok
    _, n_sample = predictor.level(-1)
    excesses = sample_thresholds(n_sample, predictor.config)
    per_thr = threshold_predictions(predictor, gallery_size, excesses, estimator="evt_support")
    maps = {n: float(v[rows].mean()) for n, v in per_thr.items()}
    out.threshold_maps = maps
    out.threshold_spread = max(maps.values()) - min(maps.values())
    own = maps[max(MIN_EXCESSES, sample_excesses(n_sample, predictor.config))]
    moved = max(abs(v - own) for v in maps.values())
    if moved > noise:
        out.flags.append(
            f"threshold-unstable: mAP@{predictor.k} moves by {moved:.3f} between "
            f"{min(maps)} and {max(maps)} exceedances (query noise {noise:.3f})"
        )
    check_bump(
        out, predictor, gallery_size,
        lambda share, bound: f"bump above the tail: {share:.0%} of queries have a sampled score "
        "the fitted tail makes improbable (rare near-copies? the pool holds N/S times more); "
        f"if every query had them above its positives: mAP@{predictor.k} {bound:.3f}",
    )  # fmt: skip


def check_bump(out, predictor, gallery_size: int, describe) -> None:
    """Record the share of queries whose top sampled score stands apart from their tail, and
    when it passes ``OUTLIER_SHARE`` flag it with ``describe(share, bound)``, ``bound`` the
    mAP@k of :func:`bump_bound` (each estimator words the flag its own way)."""
    share = tail_outlier_share(predictor)
    out.outlier_share = share
    if share > OUTLIER_SHARE:
        out.bump_bound = bump_bound(predictor, gallery_size, share)
        out.flags.append(describe(share, out.bump_bound))


def bump_bound(predictor, gallery_size: int, share: float) -> float:
    """mAP@k if every query had the bump: each positive's hardness raised by the pooled
    rate of outlying top scores (``share`` of the queries, one each in S), a lower bound
    when the copies outrank every positive."""
    x, _, _ = predictor.hardness("evt_support")
    n_sample = predictor.level_size(-1)
    aps = []
    for v in predictor.row_views() or [predictor]:
        rows = x[v.rows] if v is not predictor else x
        raised = torch.where(v.valid, rows + share / n_sample, rows)
        aps.append(ap_at_k_from_hardness(v.j, v.valid, raised, gallery_size, v.k, "plugin"))
    return float(torch.cat(aps)[predictor.query_ok].mean())


def tail_outlier_share(predictor, n_spacings: int = 20) -> float:
    """Share of queries whose top sampled score stands apart from the rest of their tail.

    Near the top of a GPD tail with ξ ≤ 0 the normalised spacings i·(s_(i) − s_(i+1))
    are at most exponential with a common mean; the top one exceeding
    −log(0.01) ≈ 4.6 times the mean of the next ``n_spacings`` has < 1% chance
    (less for bounded tails). A share of such queries well above 1% is a bump of
    rare near-copies above the tail, which a sample holds a few of and the pool
    N/S times more.
    """
    top, _ = predictor.level(-1)
    m = min(n_spacings + 1, top.shape[1] - 1)
    if m < 3:
        return 0.0
    head = top[:, : m + 1].to(torch.float64)
    gaps = head[:, :-1] - head[:, 1:]  # D_1 … D_m
    weights = torch.arange(2, m + 1, dtype=torch.float64)
    scale = (gaps[:, 1:] * weights).mean(1)
    rows = predictor.query_ok & torch.isfinite(head).all(1) & (scale > 0)
    if not bool(rows.any()):
        return 0.0
    apart = gaps[:, 0] > -math.log(0.01) * scale
    return float(apart[rows].double().mean())


def check_fixed_thresholds(
    predictor, gallery_size: int, refit: str, per_thr, out: Diagnostics
) -> None:
    """Fill ``out``'s threshold maps, spread and shape shift, and flag an unstable threshold."""
    rows = predictor.query_ok
    per_thr = per_thr or threshold_predictions(predictor, gallery_size, estimator=refit)
    maps = {n: float(v[rows].mean()) for n, v in per_thr.items()}
    out.threshold_maps = maps
    out.threshold_spread = max(maps.values()) - min(maps.values())
    shallow, deep = min(per_thr), max(per_thr)
    xi = {}
    for n in (shallow, deep):
        fit = _fit_at(predictor, n, refit)
        ok = fit.ok & rows
        xi[n] = float(fit.xi[ok].median()) if bool(ok.any()) else float("nan")
    out.shape_shift = xi[deep] - xi[shallow]
    if out.threshold_spread > THRESHOLD_TOLERANCE:
        out.flags.append(
            f"threshold-unstable: mAP@{predictor.k} moves by {out.threshold_spread:.3f} between "
            f"{shallow} and {deep} exceedances"
        )
    if abs(out.shape_shift) > SHAPE_TOLERANCE:
        out.flags.append(
            f"shape-unstable: median fitted ξ {xi[shallow]:+.2f} at {shallow} vs {xi[deep]:+.2f} "
            f"at {deep} exceedances"
        )
