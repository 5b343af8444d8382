"""The built-in tail estimators, each registered by name (``registry``).

``tail_pooled`` (the default, chosen on design families of worlds and judged on
held-out ones: docs/tail_validation.md) is ``tail``'s posterior over the GPD
shape, pooled across queries, at a sample-size-aware threshold, with an
interval for the fixed query set (``uncertainty``); ``evt_support`` the
paper's plug-in GPD with the shape bound following the score support (ξ ≤ 0
for scores in [−1, 1], ξ ≤ 0.5 otherwise); ``tail`` the tail-aware
estimator with GPD parameter uncertainty and the predictive rank law
(``bayes``); ``evt`` the paper's plug-in GPD; ``count`` and ``sample`` its
counting and naive baselines; ``single_x``, ``powerlaw`` and ``loguniform`` its
homogeneous-hardness and curve-fit baselines (``baselines``).
"""

from __future__ import annotations

import abc
import dataclasses
import math

import torch

from rl_gap.metrics.tail.baselines import (
    fit_curve,
    interpolate,
    invert_decreasing,
    single_x_curves,
    single_x_predict,
)
from rl_gap.metrics.tail.diagnostics import check_fixed_thresholds, check_sample_thresholds
from rl_gap.metrics.tail.hardness import (
    count_hardness,
    gpd_hardness,
    sample_excesses,
    support_inputs,
)
from rl_gap.metrics.tail.intervals import percentile_interval
from rl_gap.metrics.tail.posterior_predictive import tail_precision_terms
from rl_gap.metrics.tail.rank_law import RANK_LAWS, ap_at_k_from_hardness, ap_from_precision_terms
from rl_gap.metrics.tail.registry import PREDICTIVE, Estimator, register_estimator
from rl_gap.metrics.tail.sub_samples import measured_ap


class SampleMetric(Estimator):
    """``sample``: the metric of the sample gallery itself (N = S), the naive baseline."""

    name = "sample"
    summary = "the metric measured on the sample gallery (N = S)"
    cost = "one count per positive"
    joint_bootstrap = True
    realized = True

    separable_rows = True

    def per_query(self, view, gallery_size, rank_law, level, weight, bayes):
        return measured_ap(view, level, weight)


class HardnessEstimator(Estimator):
    """Per-positive hardness x, then AP@k through the rank law (``rank_law``).

    A subclass says how its hardness comes from a level's kept scores
    (``estimate_hardness``); the threshold checks refit it with other settings.
    """

    per_positive = True
    joint_bootstrap = True
    separable_rows = True

    def estimate_hardness(self, pos_sorted, valid, top, n_sample, weight, config):
        """(x, counts, fit) from (Q, m) sorted positives and a level's (Q, T) kept scores."""
        return count_hardness(pos_sorted, valid, top, n_sample, weight)

    def hardness(self, view, level, weight):
        top, n = view.level(level)
        return self.estimate_hardness(view.pos_sorted, view.valid, top, n, weight, view.config)

    def per_query(self, view, gallery_size, rank_law, level, weight, bayes):
        views = view.row_views() if self.separable_rows else None
        if views is None:
            x, _, _ = view.hardness(self, level, weight)
            return ap_at_k_from_hardness(view.j, view.valid, x, gallery_size, view.k, rank_law)
        # Many queries × positives: a block of rows at a time. The full sample's hardness
        # is kept (the estimate reports it, curves reuse it); other levels are not.
        levels = len(view.fractions)
        if weight is None and level % levels == levels - 1:
            x = view.hardness(self, level)[0]
            parts = [(v, x[v.rows]) for v in views]
        else:
            parts = [(v, self.hardness(v, level, v.weight(weight))[0]) for v in views]
        return torch.cat(
            [ap_at_k_from_hardness(v.j, v.valid, x, gallery_size, v.k, rank_law) for v, x in parts]
        )


class Count(HardnessEstimator):
    name = "count"
    summary = "x = K/S, the sampled share of distractors above each positive"
    cost = "one count per positive"


class PluginGPD(HardnessEstimator):
    name = "evt"
    summary = "the paper's plug-in GPD tail (top 4,000, 95th percentile)"
    cost = "one GPD fit per query on its top 4,000 scores"

    def estimate_hardness(self, pos_sorted, valid, top, n_sample, weight, config):
        return gpd_hardness(pos_sorted, valid, top, n_sample, weight, config)

    def kept_depth(self, config):
        return config.n_top

    def check_threshold(self, view, gallery_size, noise, per_thr, out):
        check_fixed_thresholds(view, gallery_size, self, per_thr, out)

    def warnings(self, view):
        if view.sample_size >= view.config.n_top:
            return []
        return [
            f"distractor sample ({view.sample_size}) is smaller than the EVT's top "
            f"{view.config.n_top}; using all sampled scores"
        ]


class SupportGPD(HardnessEstimator):
    name = "evt_support"
    summary = "plug-in GPD, threshold by sample size, shape bound by the score range"
    cost = "one GPD fit per query, three more for its threshold check"

    def estimate_hardness(self, pos_sorted, valid, top, n_sample, weight, config):
        pos_sorted, top, config = support_inputs(pos_sorted, top, n_sample, config)
        return gpd_hardness(pos_sorted, valid, top, n_sample, weight, config)

    def check_threshold(self, view, gallery_size, noise, per_thr, out):
        check_sample_thresholds(view, gallery_size, noise, out, self)


class PosteriorTail(HardnessEstimator):
    """``tail``: GPD posterior over the shape, posterior-predictive E[AP@k], bias-corrected."""

    name = "tail"
    summary = "GPD posterior over the shape ξ, predictive E[AP@k]"
    cost = "~7 plain fits (bias correction; bias_replicates=0: one)"
    rank_laws = (*RANK_LAWS, PREDICTIVE)
    own_rank_law = PREDICTIVE
    separable_rows = False  # the empirical-Bayes prior pools every query's tail

    def hardness(self, view, level, weight, bayes=None):
        bayes = bayes or view.bayes
        counts, post = view.tail_fit(level, weight, bayes)
        _, n = view.level(level)
        # Posterior-mean hardness does not depend on N; any N ≥ n gives it.
        _, x = tail_precision_terms(
            view.pos_sorted, view.valid, view.j, counts, post, n, n, 1, bayes
        )
        return x, counts, post

    def per_query(self, view, gallery_size, rank_law, level, weight, bayes):
        if rank_law != PREDICTIVE:
            return super().per_query(view, gallery_size, rank_law, level, weight, bayes)
        terms = view.tail_terms(gallery_size, level, weight, bayes)
        return ap_from_precision_terms(terms, view.valid, view.k)

    def checked_as(self, rank_law):
        # ~7 plain fits a prediction: checked through the plug-in GPD, whose
        # threshold and budget it shares.
        return (PLUGIN_GPD, "plugin")

    def replicate_settings(self, view, rank_law):
        # Replicates refit without the bias correction (~7 plain fits) and carry
        # each query's correction from the full sample.
        if rank_law == PREDICTIVE and view.bayes.bias_replicates > 0:
            return dataclasses.replace(view.bayes, bias_replicates=0)
        return None


class PooledTail(PosteriorTail):
    """``tail_pooled``: the ``tail`` posterior at a sample-size-aware threshold, no bias correction.

    Each query's GPD shape has a posterior on a ξ grid under a normal prior
    whose mean and spread maximise the marginal likelihood of every query's
    tail (the queries of one model pool their tail shape). Hardness past the
    sampled maximum is averaged over that posterior, so it is zero only when
    every shape the data allow ends below the positive. The threshold follows
    the sample size (``pooled_excesses``); E[AP@k] is the predictive law.
    """

    name = "tail_pooled"
    summary = "GPD shape pooled across queries (posterior over ξ), threshold by sample size"
    cost = "one posterior per query on a 61-point ξ grid"
    fixed_query_interval = True

    def settings(self, view, level: int, factor: float = 1.0, coarse: bool = False):
        """The ``tail`` settings of nested level ``level`` (``factor`` scales the exceedances;
        ``coarse``: a 21-point ξ grid, for the interval's replicates and refits)."""
        n = pooled_excesses(view.level_size(level), view.config, factor)
        grid = {"n_xi": COARSE_XI} if coarse else {}
        # The shape's support follows the declared range: ξ ≤ 0 for scores bounded above.
        rng = view.config.score_range
        xi_max = 0.0 if rng is not None and math.isfinite(rng[1]) else view.bayes.xi_max
        return dataclasses.replace(view.bayes, n_excess=n, bias_replicates=0, xi_max=xi_max, **grid)

    def kept_depth(self, config):
        # The threshold refits reach twice its own exceedances.
        return max(
            super().kept_depth(config), int(4 * POOLED_FACTOR * sample_excesses(10**12, config)) + 1
        )

    def hardness(self, view, level, weight, factor=1.0, coarse=False):
        view.clip_to_declared_range()
        return super().hardness(view, level, weight, self.settings(view, level, factor, coarse))

    def per_query(self, view, gallery_size, rank_law, level, weight, bayes):
        view.clip_to_declared_range()
        if rank_law != PREDICTIVE:
            return HardnessEstimator.per_query(
                self, view, gallery_size, rank_law, level, weight, bayes
            )
        own = self.settings(view, level)
        return super().per_query(view, gallery_size, rank_law, level, weight, own)

    def bump_hardness(self, view):
        # The bump's bound raises the plug-in GPD's hardness at the sample-size threshold.
        return view.hardness(SUPPORT_GPD)[0]

    def checked_as(self, rank_law):
        return (self, rank_law)

    def replicate_settings(self, view, rank_law):
        return None


#: ξ grid points of ``tail_pooled``'s interval replicates and refits (the prediction: 61).
COARSE_XI = 21
#: ``tail_pooled``'s exceedances, relative to the sample-size rule of ``evt_support``.
POOLED_FACTOR = 1.0


def pooled_excesses(n_sample: int, config, factor: float = 1.0) -> int:
    """Exceedances ``tail_pooled`` fits for a sample of ``n_sample``: ``POOLED_FACTOR`` ×
    ``factor`` × ``evt_support``'s (20 at S = 10⁴, 63 at 10⁵), at least ``min_excesses``."""
    n = int(round(POOLED_FACTOR * factor * sample_excesses(n_sample, config)))
    return max(int(config.min_excesses), min(n, max(n_sample - 1, 1)))


class CurveBaseline(Estimator):
    """An estimator of the mean alone, refitted in every query-bootstrap replicate."""

    def point_and_interval(self, view, gallery_size, per_query, n_boot, confidence):
        rows = view.query_ok.nonzero().squeeze(1)
        gen = view.generator()
        idx = torch.randint(0, rows.numel(), (n_boot, rows.numel()), generator=gen)
        pick = torch.cat([torch.arange(rows.numel()).unsqueeze(0), idx])  # row 0: all queries
        pred = self.predict_rows(view, gallery_size, rows, pick)
        ci = percentile_interval(pred[1:], confidence) if n_boot > 0 else None
        return float(pred[0]), ci

    @abc.abstractmethod
    def predict_rows(self, view, gallery_size, rows, pick) -> torch.Tensor:
        """(1 + B,) predictions from the queries ``rows[pick[b]]`` of each replicate b."""


class SingleX(CurveBaseline):
    name = "single_x"
    summary = "one hardness shared by every positive, calibrated on the sample's mAP"
    cost = "a 1,200-point curve per query"

    def grid(self, view):
        return view.memo("single_x", lambda: single_x_curves(view.j, view.valid, view.k))

    def per_query(self, view, gallery_size, rank_law, level, weight, bayes):
        lam, grid = self.grid(view)
        measured = measured_ap(view, level, weight)
        ok = view.query_ok
        mean = grid[ok].mean(0, keepdim=True)
        # λ = n·x at which the homogeneous map reproduces the sample's mAP at n = S.
        lam_s = invert_decreasing(lam, mean, measured[ok].mean().view(1))
        n = view.level_size(level)
        at = (lam_s * gallery_size / n).expand(grid.shape[0])
        return interpolate(lam, grid.nan_to_num(0.0), at)

    def predict_rows(self, view, gallery_size, rows, pick):
        lam, grid = self.grid(view)
        measured = measured_ap(view)[rows]
        curves = grid[rows][pick].mean(1)  # (1 + B, G)
        ratio = gallery_size / view.sample_size
        return single_x_predict(lam, curves, measured[pick].mean(1), ratio)


class CurveFit(CurveBaseline):
    """A fit of mAP against the nested sub-sample sizes, evaluated at N (mean only)."""

    def __init__(self, name: str, summary: str) -> None:
        self.name, self.summary, self.cost = name, summary, "a 2-parameter fit per replicate"

    def per_query(self, view, gallery_size, rank_law, level, weight, bayes):
        return torch.full((view.pos_sorted.shape[0],), math.nan, dtype=torch.float64)

    def predict_rows(self, view, gallery_size, rows, pick):
        levels = [i for i in range(len(view.fractions)) if view.level_size(i) > 0]
        sizes = torch.tensor([float(view.level_size(i)) for i in levels], dtype=torch.float64)
        per_level = torch.stack([measured_ap(view, i)[rows] for i in levels], 1)  # (q, L)
        return fit_curve(sizes, per_level[pick].mean(1), self.name, float(gallery_size))


#: The registered ``evt`` (``tail`` is checked through it).
PLUGIN_GPD = PluginGPD()
#: The registered ``evt_support`` (``tail_pooled`` bounds a bump with its hardness).
SUPPORT_GPD = SupportGPD()

for _estimator in (
    PosteriorTail(),
    PLUGIN_GPD,
    SUPPORT_GPD,
    Count(),
    SampleMetric(),
    SingleX(),
    CurveFit("powerlaw", "mAP(n) = a·n^b fitted to the nested sub-samples"),
    CurveFit("loguniform", "mAP(n) = a + b·log n fitted to the nested sub-samples"),
    PooledTail(),
):
    register_estimator(_estimator)
