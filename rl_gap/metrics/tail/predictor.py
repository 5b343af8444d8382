"""TailPredictor: every estimator's prediction from positives and a nested top-T sample state.

Used by :func:`rl_gap.metrics.tail.predict_map`, the torchmetrics class and
``rl-gap extrapolate``; see ``docs/tail_extrapolation.md`` for the estimators.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch

from rl_gap.metrics.tail.bayes import (
    DEFAULT_BAYES,
    BayesTailConfig,
    GPDPosterior,
    gpd_posterior,
)
from rl_gap.metrics.tail.diagnostics import diagnose as diagnose_prediction
from rl_gap.metrics.tail.hardness import (
    DEFAULT_CONFIG,
    TailConfig,
    TailFit,
    clip_to_range,
    sample_counts,
)
from rl_gap.metrics.tail.inputs import EstimateRequest, check_predictor_inputs, resolve_request
from rl_gap.metrics.tail.intervals import joint_bootstrap
from rl_gap.metrics.tail.posterior_predictive import tail_precision_terms
from rl_gap.metrics.tail.rank_law import sort_positives
from rl_gap.metrics.tail.registry import get_estimator, resolve_rank_law
from rl_gap.metrics.tail.results import TailEstimate
from rl_gap.metrics.tail.rows import RowView, concat_rows, fill_rows, row_slices
from rl_gap.metrics.tail.sampling import NestedTopK
from rl_gap.metrics.tail.sub_samples import (
    budget_check,
    measured_on_sub_samples,
    prediction_curve,
)
from rl_gap.metrics.tail.uncertainty import error_flags, fixed_query_uncertainty

#: The stages :meth:`TailPredictor.estimate` reports to ``on_stage``, in order.
ESTIMATE_STAGES = ("fit", "interval", "joint bootstrap", "budget", "checks", "done")


class TailPredictor:
    """Predictions at any gallery size from positives and a nested top-T sample state.

    Args:
        pos_scores: (Q, m) positive scores, NaN-padded.
        state: the per-query top-T sample scores (full sample = last level).
        k: AP cut-off.
        config: EVT settings.
        seed: bootstrap seed.
        bayes: settings of the ``tail`` estimator.
    """

    def __init__(
        self,
        pos_scores: torch.Tensor,
        state: NestedTopK,
        k: int,
        config: TailConfig = DEFAULT_CONFIG,
        seed: int = 0,
        bayes: BayesTailConfig = DEFAULT_BAYES,
    ) -> None:
        check_predictor_inputs(pos_scores, state, k)
        # The estimate runs on the host: the kept state is small (P·Q·T scores), the fits
        # iterate per query on data-dependent shapes, and the bootstraps draw from CPU
        # generators, so a prediction does not depend on the device the sample was scored on.
        pos_scores = pos_scores.cpu()
        if state.top.device.type != "cpu":
            keys = None if state.keys is None else state.keys.cpu()
            state = NestedTopK.from_tensors(
                state.top.cpu(), state.seen.cpu(), state.fractions, keys
            )
        self.k = int(k)
        self.config = config
        self.bayes = bayes
        self.state = state
        self.seed = seed
        blocks = row_slices(pos_scores.shape[0], pos_scores.shape[1])
        sorted_rows = [sort_positives(pos_scores[rows]) for rows in blocks]
        self.pos_sorted, self.valid, self.j = concat_rows(sorted_rows)
        self.query_ok = self.valid.any(1)
        self.sample_size = int(state.seen.sum())
        self._levels: dict[int, tuple[torch.Tensor, int]] = {}
        self._level_keys: dict[int, torch.Tensor | None] = {}
        self._tail_fits: dict[tuple, tuple[torch.Tensor, GPDPosterior]] = {}
        self._tail_terms: dict[tuple[int, int, BayesTailConfig], torch.Tensor] = {}
        self._hardness: dict[
            tuple[str, int], tuple[torch.Tensor, torch.Tensor, TailFit | GPDPosterior | None]
        ] = {}
        self._memo: dict[str, object] = {}
        self._range_clipped = False

    def clip_to_declared_range(self) -> None:
        """Clip the positives and the kept sample to ``config.score_range`` (rounding overshoot),
        refusing scores further out; once (estimators that bound the tail by the range call it)."""
        if self._range_clipped or self.config.score_range is None:
            return
        rng = self.config.score_range
        self.pos_sorted = clip_to_range(self.pos_sorted, rng, "positive scores")
        self.state.top.copy_(clip_to_range(self.state.top, rng, "sampled distractor scores"))
        self._levels.clear()  # rebuilt from the clipped state
        self._range_clipped = True

    @property
    def n_queries_valid(self) -> int:
        return int(self.query_ok.sum())

    @property
    def n_excluded(self) -> int:
        return int((~self.query_ok).sum())

    def level(self, index: int = -1) -> tuple[torch.Tensor, int]:
        """(top (Q, T) sorted descending, size) of nested sub-sample ``index``."""
        index = index % len(self.state.fractions)
        if index in self._levels:
            return self._levels[index]
        views = self.row_views()
        if views is None:
            top, keys, size = self.state.level_with_keys(index)
        else:  # many queries: built a block of rows at a time
            blocks = ((v.rows, self.state.level_with_keys(index, v.rows)) for v in views)
            top, keys, size = fill_rows(self.pos_sorted.shape[0], blocks)
        if index != len(self.state.fractions) - 1 and views is not None:
            # The sub-sample levels are read a block of rows at a time (``rows.RowView.level``);
            # one asked for whole is not kept.
            return top, size
        self._levels[index] = (top, size)
        self._level_keys[index] = keys
        return self._levels[index]

    def cached_level(self, index: int = -1) -> tuple[torch.Tensor, int] | None:
        """:meth:`level` if it is kept, else None."""
        return self._levels.get(index % len(self.state.fractions))

    def level_size(self, index: int = -1) -> int:
        """The size of nested sub-sample ``index`` (its top scores not built)."""
        return int(self.state.seen[: index % len(self.state.fractions) + 1].sum())

    def level_keys(self, index: int = -1) -> torch.Tensor | None:
        """(Q, T) distractor keys aligned with :meth:`level` (None if the state has none)."""
        self.level(index)
        return self._level_keys[index % len(self.state.fractions)]

    def tail_fit(
        self,
        level: int = -1,
        weight: torch.Tensor | None = None,
        bayes: BayesTailConfig | None = None,
    ) -> tuple[torch.Tensor, GPDPosterior]:
        """(sampled counts K_S, GPD posterior) of the ``tail`` estimator on a level.

        ``bayes`` (default: the predictor's own settings) is what the posterior is
        built from. Cached per level and posterior settings without bootstrap weights.
        """
        config = bayes or self.bayes
        index = level % len(self.state.fractions)
        # The bias correction's settings do not change the posterior.
        key = (index, dataclasses.replace(config, bias_replicates=0, bias_seed=0))
        if weight is None and key in self._tail_fits:
            return self._tail_fits[key]
        top, n = self.level(level)
        counts, _ = sample_counts(self.pos_sorted, self.valid, top, weight)
        fit = counts, gpd_posterior(top, n, weight, config)
        if weight is None:
            self._tail_fits[key] = fit
        return fit

    def hardness(
        self, estimator: str, level: int = -1, weight: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, TailFit | GPDPosterior | None]:
        """(x, counts, fit) of a per-positive estimator (``count``, ``evt``, ``tail``…) on a level.

        For ``tail`` x is the posterior-mean hardness and fit the GPDPosterior.
        """
        key = (estimator, level % len(self.state.fractions))
        if weight is None and key in self._hardness:
            return self._hardness[key]
        est = get_estimator(estimator)
        views = self.row_views() if est.separable_rows else None
        if views is None:
            out = est.hardness(self, level, weight)
        else:
            n = self.pos_sorted.shape[0]
            out = fill_rows(n, ((v.rows, est.hardness(v, level, v.weight(weight))) for v in views))
        if weight is None:
            self._hardness[key] = out
        return out

    def tail_terms(
        self,
        gallery_size: int,
        level: int = -1,
        weight: torch.Tensor | None = None,
        bayes: BayesTailConfig | None = None,
    ) -> torch.Tensor:
        """(Q, m) the ``tail`` estimator's predictive E[precision] of each sorted positive.

        Its AP@k is :func:`ap_from_precision_terms` of these (``per_query``).
        Cached for the predictor's own settings: the bias correction makes a
        call cost ~7 plain fits, and ``estimate`` and a per-positive split
        both need it.
        """
        key = (level % len(self.state.fractions), int(gallery_size), bayes or self.bayes)
        cache = weight is None
        if cache and key in self._tail_terms:
            return self._tail_terms[key]
        # The posterior, like the bias correction, follows ``bayes`` (n_excess, ξ grid, prior).
        counts, post = self.tail_fit(level, weight, bayes)
        _, n = self.level(level)
        terms, _ = tail_precision_terms(
            self.pos_sorted,
            self.valid,
            self.j,
            counts,
            post,
            n,
            gallery_size,
            self.k,
            bayes or self.bayes,
        )
        if cache:
            self._tail_terms[key] = terms
        return terms

    def per_query(
        self,
        estimator: str,
        gallery_size: int,
        rank_law: str | None = None,
        level: int = -1,
        weight: torch.Tensor | None = None,
        bayes: BayesTailConfig | None = None,
    ) -> torch.Tensor:
        """(Q,) per-query AP@k; NaN for queries without positives (and for curve fits).

        ``bayes`` overrides the ``tail`` estimator's settings for this call (its
        posterior and its bias correction).
        """
        est = get_estimator(estimator)
        law = resolve_rank_law(est, rank_law)
        ap = est.per_query(self, gallery_size, law, level, weight, bayes)
        return torch.where(self.query_ok, ap, torch.full_like(ap, math.nan))

    def row_views(self, cached: tuple | None = None) -> list[RowView] | None:
        """Blocks of query rows when the per-positive arrays exceed one block (``rows``);
        None when one block holds them, or when ``cached`` hardness is already at hand."""
        if cached is not None and cached in self._hardness:
            return None
        width = max(self.pos_sorted.shape[1], self.state.capacity)
        blocks = row_slices(self.pos_sorted.shape[0], width)
        return None if len(blocks) == 1 else [RowView(self, rows) for rows in blocks]

    def memo(self, key: str, build):
        """``build()`` once per predictor (an estimator's data that does not depend on N)."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def generator(self, offset: int = 0) -> torch.Generator:
        """A fresh CPU generator from the predictor's seed (+ ``offset``)."""
        return torch.Generator().manual_seed(self.seed + offset)

    def estimate(
        self,
        estimator: str,
        gallery_size: int,
        rank_law: str | None = None,
        n_boot: int = 1000,
        confidence: float = 0.95,
        nested_boot: int = 0,
        budget: bool = False,
        diagnose: bool = True,
        on_stage=None,
    ) -> TailEstimate:
        """Predicted mAP@k at ``gallery_size`` with a query-bootstrap interval.

        Args:
            estimator: a registered name (``available_estimators()``; the default of
                :func:`predict_map` is :data:`DEFAULT_ESTIMATOR`).
            gallery_size: N to predict for (≥ S).
            rank_law: None (the estimator's own: "predictive" for tail, else
                "plugin"), "plugin", "binomial" or "poisson" (see rank_law).
            n_boot: query-bootstrap replicates; 0 = no interval (``ci`` and
                ``ci_total`` None; the budget check then takes its query noise
                from 200 replicates of its own).
            confidence: interval mass.
            nested_boot: if > 0, also resample the distractor sample this many
                times (Poisson(1) multiplicities) jointly with the queries, for
                ``nested_ci`` and ``sample_noise_sd`` (``intervals.joint_bootstrap``).
            budget: add the sufficient-budget diagnostic (S/4, S/2, S).
            diagnose: for the per-positive estimators, run the checks of
                ``diagnostics`` and fill ``flags``, ``ci_total`` and ``diagnostics``.
            on_stage: optional ``on_stage(name)`` called as each stage starts
                (:data:`ESTIMATE_STAGES`), for progress display.
        """
        request = resolve_request(
            estimator, gallery_size, self.sample_size, self.k, rank_law, n_boot, confidence,
            nested_boot, budget, diagnose,
        )  # fmt: skip
        return self.run(request, on_stage)

    def run(self, request: EstimateRequest, on_stage=None) -> TailEstimate:
        """:meth:`estimate` of a checked request (``inputs.resolve_request``), stage by stage."""
        stage = on_stage or (lambda name: None)
        self._warn_small_sample(request)
        stage("fit")
        per_query = self.per_query(request.name, request.gallery_size, request.rank_law)
        stage("interval")
        est = self._point_estimate(request, per_query)
        if request.n_boot > 0 and request.estimator.fixed_query_interval:
            # ``ci`` is for these queries; the query bootstrap keeps its own name.
            parts = fixed_query_uncertainty(
                self, request.estimator, request.gallery_size, request.rank_law, est.map,
                request.confidence,
            )  # fmt: skip
            est.ci, est.uncertainty = parts["ci"], parts
        stage("joint bootstrap")
        if request.nested_boot > 0 and request.estimator.joint_bootstrap:
            est.nested_ci, est.sample_noise_sd = joint_bootstrap(
                self, request.estimator, request.gallery_size, request.rank_law,
                request.nested_boot, request.confidence, per_query,
            )  # fmt: skip
        stage("budget")
        if request.budget and request.estimator.per_positive:
            est.budget = self.budget(
                request.name, request.gallery_size, request.rank_law, request.n_boot,
                request.confidence, est.ci,
            )  # fmt: skip
        stage("checks")
        if request.diagnose:
            self._check(request, est)
        stage("done")
        return est

    def _warn_small_sample(self, request: EstimateRequest) -> None:
        reasons = request.estimator.warnings(self)
        if self.sample_size < self.k:
            reasons.insert(
                0,
                f"the distractor sample has {self.sample_size} scores per query, fewer than "
                f"k = {self.k}: the prediction rests on almost no distractor and is unreliable",
            )
        for reason in reasons:
            warnings.warn(reason, stacklevel=4)

    def _point_estimate(self, request: EstimateRequest, per_query: torch.Tensor) -> TailEstimate:
        """The prediction, its query-bootstrap interval and (per-positive) its fit."""
        if not bool(self.query_ok.any()):
            raise ValueError("no query has a positive: nothing to evaluate")
        est_obj, n = request.estimator, request.gallery_size
        mean, ci = est_obj.point_and_interval(
            self, n, per_query, request.n_boot, request.confidence
        )
        est = TailEstimate(
            map=mean,
            ci=ci,
            ci_over_queries=ci,
            per_query=per_query,
            estimator=request.name,
            rank_law="realized" if est_obj.realized else request.rank_law,
            gallery_size=self.sample_size if est_obj.realized else int(n),
            k=self.k,
            sample_size=self.sample_size,
            n_queries=int(self.query_ok.sum()),
            n_excluded=self.n_excluded,
        )
        if est_obj.per_positive:
            est.hardness, _, est.fit = self.hardness(request.name)
            if est.fit is not None:
                est.tail_ok = est.fit.ok
        return est

    def _check(self, request: EstimateRequest, est: TailEstimate) -> None:
        """Fill ``flags``, ``ci_total`` and ``diagnostics`` with the checks the estimator names."""
        if request.estimator.fixed_query_interval:
            if est.uncertainty is None:  # no interval asked for (n_boot = 0): no flags
                return
            diag = error_flags(self, request.gallery_size, est.uncertainty)
            est.diagnostics, est.flags = diag, list(diag.flags)
            est.ci_total = diag.widen_to_bump(est.ci)
            return
        checked = request.estimator.checked_as(request.rank_law)
        if checked is None:
            return
        name, law = checked
        own = name == request.name  # checked through another estimator: not its interval
        diag = diagnose_prediction(
            self, request.gallery_size, name, law,
            ci=est.ci if own else None, budget=est.budget if own else None,
        )  # fmt: skip
        est.diagnostics, est.flags = diag, list(diag.flags)
        est.ci_total = diag.widen(est.nested_ci if est.nested_ci is not None else est.ci)

    def budget(
        self,
        estimator: str,
        gallery_size: int,
        rank_law: str | None = None,
        n_boot: int = 1000,
        confidence: float = 0.95,
        ci: tuple[float, float] | None = None,
    ) -> dict:
        """Sufficient-budget diagnostic (paper App. D): :func:`sub_samples.budget_check`."""
        return budget_check(self, estimator, gallery_size, rank_law, n_boot, confidence, ci)

    def curve(
        self,
        estimator: str,
        sizes: list[int],
        rank_law: str | None = None,
        n_boot: int = 500,
        confidence: float = 0.95,
    ) -> tuple[list[float], list[float], list[float]]:
        """Predicted mAP@k and interval at each gallery size (hardness computed once)."""
        return prediction_curve(self, estimator, sizes, rank_law, n_boot, confidence)

    def measured(self, n_boot: int = 500, confidence: float = 0.95) -> list[dict]:
        """The metric measured on each nested sub-sample gallery (S/8 … S)."""
        return measured_on_sub_samples(self, n_boot, confidence)
