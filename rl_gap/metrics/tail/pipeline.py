"""The staged run of a tail prediction: fit, interval, joint bootstrap, budget, checks.

The orchestrator above the maths: it reads a prediction's data through a
:class:`~rl_gap.metrics.tail.view.TailView` (a
:class:`~rl_gap.metrics.tail.predictor.TailPredictor`), asks the request's
estimator for its per-query values and interval, and runs the stages the
estimator declares (``fixed_query_interval``, ``joint_bootstrap``,
``per_positive``, ``checked_as``). Every input is checked once, on entry
(:func:`~rl_gap.metrics.tail.inputs.resolve_request`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from rl_gap.metrics.tail.diagnostics import diagnose as diagnose_prediction
from rl_gap.metrics.tail.inputs import EstimateRequest, resolve_request
from rl_gap.metrics.tail.intervals import check_n_boot
from rl_gap.metrics.tail.registry import Estimator, get_estimator
from rl_gap.metrics.tail.results import TailEstimate
from rl_gap.metrics.tail.sub_samples import budget_check
from rl_gap.metrics.tail.uncertainty import error_flags, fixed_query_uncertainty, joint_bootstrap
from rl_gap.metrics.tail.view import TailView

#: The stages :func:`run` reports to ``on_stage``, in order.
ESTIMATE_STAGES = ("fit", "interval", "joint bootstrap", "budget", "checks", "done")


def estimate(
    view: TailView,
    estimator: str | Estimator,
    gallery_size: int,
    rank_law: str | None = None,
    *,
    on_stage: Callable[[str], None] | None = None,
    **options,
) -> TailEstimate:
    """Predicted mAP@k at ``gallery_size`` with its interval (``TailPredictor.estimate``).

    Args:
        view: the prediction's data (positives, nested sample state, caches).
        estimator: a registered name (``available_estimators()``) or an Estimator.
        gallery_size: N to predict for (≥ S).
        rank_law: None (the estimator's own: "predictive" for tail, else
            "plugin"), "plugin", "binomial" or "poisson" (see rank_law).
        on_stage: optional ``on_stage(name)`` called as each stage starts
            (:data:`ESTIMATE_STAGES`), for progress display.
        **options: by name, the request's options ``n_boot``, ``confidence``,
            ``nested_boot``, ``budget`` and ``diagnose``, documented with their defaults
            in :class:`~rl_gap.metrics.tail.inputs.EstimateRequest`; an unknown one is a
            TypeError.
    """
    request = resolve_request(
        estimator, gallery_size, view.sample_size, rank_law=rank_law, **options
    )
    return run(view, request, on_stage)


def run(
    view: TailView, request: EstimateRequest, on_stage: Callable[[str], None] | None = None
) -> TailEstimate:
    """:func:`estimate` of a checked request (``inputs.resolve_request``), stage by stage."""
    stage = on_stage or (lambda name: None)
    est_obj, n, law = request.estimator, request.gallery_size, request.rank_law
    _warn_small_sample(view, est_obj)
    stage("fit")
    per_query = est_obj.ap(view, n, law)
    stage("interval")
    est = _point_estimate(view, request, per_query)
    if request.n_boot > 0 and est_obj.fixed_query_interval:
        # ``ci`` is for these queries; the query bootstrap keeps its own name.
        parts = fixed_query_uncertainty(view, est_obj, n, law, est.map, request.confidence)
        est.ci, est.uncertainty = parts["ci"], parts
    stage("joint bootstrap")
    if request.nested_boot > 0 and est_obj.joint_bootstrap:
        est.nested_ci, est.sample_noise_sd = joint_bootstrap(
            view, est_obj, n, law, request.nested_boot, request.confidence, per_query
        )
    stage("budget")
    if request.budget and est_obj.per_positive:
        est.budget = budget_check(view, est_obj, n, law, request.n_boot, request.confidence, est.ci)
    stage("checks")
    if request.diagnose:
        _check(view, request, est)
    stage("done")
    return est


def _warn_small_sample(view: TailView, estimator: Estimator) -> None:
    reasons = estimator.warnings(view)
    if view.sample_size < view.k:
        reasons.insert(
            0,
            f"the distractor sample has {view.sample_size} scores per query, fewer than "
            f"k = {view.k}: the prediction rests on almost no distractor and is unreliable",
        )
    for reason in reasons:
        warnings.warn(reason, stacklevel=4)


def _point_estimate(view: TailView, request: EstimateRequest, per_query) -> TailEstimate:
    """The prediction, its query-bootstrap interval and (per-positive) its fit."""
    if not bool(view.query_ok.any()):
        raise ValueError("no query has a positive: nothing to evaluate")
    est_obj, n = request.estimator, request.gallery_size
    mean, ci = est_obj.point_and_interval(view, n, per_query, request.n_boot, request.confidence)
    est = TailEstimate(
        map=mean,
        ci=ci,
        ci_over_queries=ci,
        per_query=per_query,
        estimator=request.name,
        rank_law="realized" if est_obj.realized else request.rank_law,
        gallery_size=view.sample_size if est_obj.realized else int(n),
        k=view.k,
        sample_size=view.sample_size,
        n_queries=int(view.query_ok.sum()),
        n_excluded=int((~view.query_ok).sum()),
    )
    if est_obj.per_positive:
        est.hardness, _, est.fit = view.hardness(est_obj)
        if est.fit is not None:
            est.tail_ok = est.fit.ok
    return est


def _check(view: TailView, request: EstimateRequest, est: TailEstimate) -> None:
    """Fill ``flags``, ``ci_total`` and ``diagnostics`` with the checks the estimator names."""
    est_obj = request.estimator
    if est_obj.fixed_query_interval:
        if est.uncertainty is None:  # no interval asked for (n_boot = 0): no flags
            return
        diag = error_flags(
            view, request.gallery_size, est.uncertainty, lambda: est_obj.bump_hardness(view)
        )
        est.diagnostics, est.flags = diag, list(diag.flags)
        est.ci_total = diag.widen_to_bump(est.ci)
        return
    checked = est_obj.checked_as(request.rank_law)
    if checked is None:
        return
    checker, law = checked
    own = checker.name == request.name  # checked through another estimator: not its interval
    diag = diagnose_prediction(
        view, request.gallery_size, checker, law,
        ci=est.ci if own else None, budget=est.budget if own else None,
    )  # fmt: skip
    est.diagnostics, est.flags = diag, list(diag.flags)
    est.ci_total = diag.widen(est.nested_ci if est.nested_ci is not None else est.ci)


def curve(
    view: TailView,
    estimator: str | Estimator,
    sizes: list[int],
    rank_law: str | None = None,
    n_boot: int = 500,
    confidence: float = 0.95,
) -> tuple[list[float], list[float], list[float]]:
    """Predicted mAP@k and interval at each gallery size (hardness computed once)."""
    check_n_boot(n_boot)
    est = get_estimator(estimator)
    maps, los, his = [], [], []
    for n in sizes:
        pq = est.ap(view, int(n), rank_law)
        mean, (lo, hi) = est.point_and_interval(view, int(n), pq, n_boot, confidence)
        maps.append(mean)
        los.append(lo)
        his.append(hi)
    return maps, los, his
