"""TailPredictor: every estimator's prediction from positives and a nested top-T sample state.

Used by :func:`rl_gap.metrics.tail.predict_map`, the torchmetrics class and
``rl-gap extrapolate``; see ``docs/tail_extrapolation.md`` for the estimators.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from statistics import NormalDist

import torch

from rl_gap.metrics.tail.baselines import (
    CURVE_ESTIMATORS,
    fit_curve,
    interpolate,
    invert_decreasing,
    single_x_curves,
    single_x_predict,
)
from rl_gap.metrics.tail.bayes import (
    DEFAULT_BAYES,
    BayesTailConfig,
    GPDPosterior,
    gpd_posterior,
)
from rl_gap.metrics.tail.diagnostics import diagnose as diagnose_prediction
from rl_gap.metrics.tail.estimate import (  # noqa: F401  (public re-exports)
    DEFAULT_ESTIMATOR,
    ESTIMATORS,
    HARDNESS_ESTIMATORS,
    PREDICTIVE,
    TailEstimate,
    _check_common,
    bootstrap_ci,
    check_n_boot,
    check_positive_scores,
    percentile_interval,
    resolve_rank_law,
)
from rl_gap.metrics.tail.hardness import (
    DEFAULT_CONFIG,
    TailConfig,
    TailFit,
    estimate_hardness,
    sample_counts,
)
from rl_gap.metrics.tail.predictive import tail_expected_ap, tail_precision_terms
from rl_gap.metrics.tail.rank_law import (
    ap_at_k_from_counts,
    ap_at_k_from_hardness,
    ap_from_precision_terms,
    sort_positives,
)
from rl_gap.metrics.tail.sampling import NestedTopK, poisson_multiplicities

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
        check_positive_scores(pos_scores, state.n_queries)
        # The estimate runs on the host: the kept state is small (P·Q·T scores), the fits
        # iterate per query on data-dependent shapes, and the bootstraps draw from CPU
        # generators, so a prediction does not depend on the device the sample was scored on.
        pos_scores = pos_scores.cpu()
        if state.top.device.type != "cpu":
            keys = None if state.keys is None else state.keys.cpu()
            state = NestedTopK.from_tensors(
                state.top.cpu(), state.seen.cpu(), state.fractions, keys
            )
        if int(k) < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if state.capacity < min(int(k), int(state.seen.sum())):
            # Counts are exact below the kept depth; with every sampled score kept, always.
            raise ValueError(
                f"the state keeps {state.capacity} scores per query; need >= "
                f"min(k = {k}, sample size)"
            )
        self.k = int(k)
        self.config = config
        self.bayes = bayes
        self.state = state
        self.seed = seed
        self.pos_sorted, self.valid, self.j = sort_positives(pos_scores)
        self.query_ok = self.valid.any(1)
        self.sample_size = int(state.seen.sum())
        self._levels: dict[int, tuple[torch.Tensor, int]] = {}
        self._level_keys: dict[int, torch.Tensor | None] = {}
        self._tail_fits: dict[tuple, tuple[torch.Tensor, GPDPosterior]] = {}
        self._tail_terms: dict[tuple[int, int], torch.Tensor] = {}
        self._hardness: dict[
            tuple[str, int], tuple[torch.Tensor, torch.Tensor, TailFit | GPDPosterior | None]
        ] = {}

    @property
    def n_queries_valid(self) -> int:
        return int(self.query_ok.sum())

    @property
    def n_excluded(self) -> int:
        return int((~self.query_ok).sum())

    def level(self, index: int = -1) -> tuple[torch.Tensor, int]:
        """(top (Q, T) sorted descending, size) of nested sub-sample ``index``."""
        index = index % len(self.state.fractions)
        if index not in self._levels:
            top, keys, size = self.state.level_with_keys(index)
            self._levels[index] = (top, size)
            self._level_keys[index] = keys
        return self._levels[index]

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
        """(x, counts, fit) for ``count``/``evt``/``tail`` on nested level ``level``.

        For ``tail`` x is the posterior-mean hardness and fit the GPDPosterior.
        """
        key = (estimator, level % len(self.state.fractions))
        if weight is None and key in self._hardness:
            return self._hardness[key]
        top, n = self.level(level)
        if estimator == "tail":
            counts, post = self.tail_fit(level, weight)
            # Posterior-mean hardness does not depend on N; any N ≥ n gives it.
            _, x = tail_expected_ap(
                self.pos_sorted, self.valid, self.j, counts, post, n, n, 1, self.bayes
            )
            out = (x, counts, post)
        else:
            out = estimate_hardness(
                estimator, self.pos_sorted, self.valid, top, n, weight, self.config
            )
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
        key = (level % len(self.state.fractions), int(gallery_size))
        cache = weight is None and (bayes is None or bayes == self.bayes)
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
        law = resolve_rank_law(estimator, rank_law)
        if estimator == "sample":
            top, _ = self.level(level)
            counts, _ = sample_counts(self.pos_sorted, self.valid, top, weight)
            ap = ap_at_k_from_counts(self.j, self.valid, counts, self.k)
        elif estimator == "tail" and law == PREDICTIVE:
            terms = self.tail_terms(gallery_size, level, weight, bayes)
            ap = ap_from_precision_terms(terms, self.valid, self.k)
        elif estimator in HARDNESS_ESTIMATORS:
            x, _, _ = self.hardness(estimator, level, weight)
            ap = ap_at_k_from_hardness(self.j, self.valid, x, gallery_size, self.k, law)
        elif estimator == "single_x":
            lam, grid = self._single_x_grid()
            measured = self.per_query("sample", gallery_size, level=level, weight=weight)
            mean = grid[self.query_ok].mean(0, keepdim=True)
            # λ = n·x at which the homogeneous map reproduces the sample's mAP at n = S.
            lam_s = invert_decreasing(lam, mean, measured[self.query_ok].mean().view(1))
            _, n = self.level(level)
            at = (lam_s * gallery_size / n).expand(grid.shape[0])
            ap = interpolate(lam, grid.nan_to_num(0.0), at)
        elif estimator in CURVE_ESTIMATORS:
            ap = torch.full((self.pos_sorted.shape[0],), math.nan, dtype=torch.float64)
        else:
            raise ValueError(f"unknown estimator {estimator!r}; known: {', '.join(ESTIMATORS)}")
        return torch.where(self.query_ok, ap, torch.full_like(ap, math.nan))

    def _single_x_grid(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not hasattr(self, "_sx"):
            self._sx = single_x_curves(self.j, self.valid, self.k)
        return self._sx

    def _aggregate(
        self, estimator: str, gallery_size: int, n_boot: int, confidence: float
    ) -> tuple[float, tuple[float, float] | None]:
        """mAP and query-bootstrap interval of the curve fits and single_x (refit per replicate)."""
        rows = self.query_ok.nonzero().squeeze(1)
        check_n_boot(n_boot)
        gen = self._generator()
        idx = torch.randint(0, rows.numel(), (n_boot, rows.numel()), generator=gen)
        pick = torch.cat([torch.arange(rows.numel()).unsqueeze(0), idx])  # row 0: all queries
        if estimator == "single_x":
            lam, grid = self._single_x_grid()
            measured = self.per_query("sample", gallery_size)[rows]
            curves = grid[rows][pick].mean(1)  # (1 + B, G)
            pred = single_x_predict(
                lam, curves, measured[pick].mean(1), gallery_size / self.sample_size
            )
        else:
            levels = [i for i in range(len(self.state.fractions)) if self.level(i)[1] > 0]
            sizes = torch.tensor([float(self.level(i)[1]) for i in levels], dtype=torch.float64)
            per_level = torch.stack(
                [self.per_query("sample", 1, level=i)[rows] for i in levels], 1
            )  # (q, L)
            pred = fit_curve(sizes, per_level[pick].mean(1), estimator, float(gallery_size))
        ci = percentile_interval(pred[1:], confidence) if n_boot > 0 else None
        return float(pred[0]), ci

    def _generator(self, offset: int = 0) -> torch.Generator:
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
            estimator: one of :data:`ESTIMATORS` (:data:`DEFAULT_ESTIMATOR`, the
                default of :func:`predict_map`; "tail", "evt", "count", "sample" =
                the metric of the sample gallery itself at N = S; the baselines
                "single_x", "powerlaw", "loguniform").
            gallery_size: N to predict for (≥ S).
            rank_law: None (the estimator's own: "predictive" for tail, else
                "plugin"), "plugin", "binomial" or "poisson" (see rank_law).
            n_boot: query-bootstrap replicates; 0 = no interval (``ci`` and
                ``ci_total`` None; the budget check then takes its query noise
                from 200 replicates of its own).
            confidence: interval mass.
            nested_boot: if > 0, also resample the distractor sample this
                many times (Poisson(1) multiplicities), jointly with the
                queries, for ``nested_ci`` and ``sample_noise_sd``. With a
                ``keyed`` state a distractor gets one multiplicity for every
                query (the sample's shared noise: one distractor that ranks
                high for many queries moves them all); otherwise each query's
                kept scores are resampled independently, which misses it.
                ``tail`` replicates refit without the bias correction and add
                each query's correction from the full sample.
            budget: add the sufficient-budget diagnostic (S/4, S/2, S).
            diagnose: for the hardness estimators, run the checks of
                ``diagnostics`` for this estimator and fill ``flags``,
                ``ci_total`` and ``diagnostics``: the S/4–S/2–S budget of its own
                prediction (``tail``: of the plug-in GPD, its cheap stand-in) and,
                for the GPD estimators, the threshold stability (``count`` has no
                threshold, so only its budget is checked).
            on_stage: optional ``on_stage(name)`` called as each stage starts
                (:data:`ESTIMATE_STAGES`), for progress display.
        """
        check_n_boot(n_boot)
        stage = on_stage or (lambda name: None)
        _check_common(gallery_size, self.sample_size, self.k, estimator, rank_law)
        rank_law = resolve_rank_law(estimator, rank_law)
        if self.sample_size < self.k:
            warnings.warn(
                f"the distractor sample has {self.sample_size} scores per query, fewer than "
                f"k = {self.k}: the prediction rests on almost no distractor and is unreliable",
                stacklevel=3,
            )
        if estimator == "evt" and self.sample_size < self.config.n_top:
            warnings.warn(
                f"distractor sample ({self.sample_size}) is smaller than the EVT's top "
                f"{self.config.n_top}; using all sampled scores",
                stacklevel=3,
            )
        stage("fit")
        per_query = self.per_query(estimator, gallery_size, rank_law)
        valid_q = per_query[self.query_ok]
        stage("interval")
        if not bool(self.query_ok.any()):
            raise ValueError("no query has a positive: nothing to evaluate")
        if estimator in ("single_x", *CURVE_ESTIMATORS):
            mean, ci = self._aggregate(estimator, gallery_size, n_boot, confidence)
        else:
            mean = float(valid_q.mean())
            ci = bootstrap_ci(per_query, n_boot, confidence, self._generator())
        est = TailEstimate(
            map=mean,
            ci=ci,
            per_query=per_query,
            estimator=estimator,
            rank_law=rank_law if estimator != "sample" else "realized",
            gallery_size=int(gallery_size) if estimator != "sample" else self.sample_size,
            k=self.k,
            sample_size=self.sample_size,
            n_queries=int(self.query_ok.sum()),
            n_excluded=self.n_excluded,
        )
        if estimator in HARDNESS_ESTIMATORS:
            est.hardness, _, est.fit = self.hardness(estimator)
            if est.fit is not None:
                est.tail_ok = est.fit.ok
        stage("joint bootstrap")
        if nested_boot > 0 and estimator in (*HARDNESS_ESTIMATORS, "sample"):
            est.nested_ci, est.sample_noise_sd = self._nested(
                estimator, gallery_size, rank_law, nested_boot, confidence, per_query
            )
        stage("budget")
        if budget and estimator in HARDNESS_ESTIMATORS:
            est.budget = self.budget(estimator, gallery_size, rank_law, n_boot, confidence, ci)
        stage("checks")
        if diagnose and estimator in HARDNESS_ESTIMATORS:
            # Each estimator's own checks; ``tail`` (~7 plain fits a prediction) is
            # checked through the plug-in GPD, whose threshold and budget it shares.
            checked = "evt" if estimator == "tail" else estimator
            own = est.budget if checked == estimator else None
            own_ci = ci if checked == estimator else None
            law = "plugin" if estimator == "tail" else rank_law
            diag = diagnose_prediction(self, gallery_size, checked, law, ci=own_ci, budget=own)
            est.diagnostics, est.flags = diag, list(diag.flags)
            est.ci_total = diag.widen(est.nested_ci if est.nested_ci is not None else ci)
        stage("done")
        return est

    def _nested(
        self,
        estimator: str,
        gallery_size: int,
        rank_law: str | None,
        n_rep: int,
        confidence: float,
        per_query: torch.Tensor,
    ) -> tuple[tuple[float, float], float]:
        gen = self._generator(1)
        top, _ = self.level(-1)
        keys = self.level_keys(-1)
        finite = torch.isfinite(top).to(torch.float64)
        rows = self.query_ok.nonzero().squeeze(1)
        # The tail estimator's bias correction costs ~7 plain fits: replicates
        # refit without it and carry each query's correction from the full sample.
        fast, shift = None, 0.0
        if estimator == "tail" and resolve_rank_law(estimator, rank_law) == PREDICTIVE:
            if self.bayes.bias_replicates > 0:
                fast = dataclasses.replace(self.bayes, bias_replicates=0)
                plain = self.per_query(estimator, gallery_size, rank_law, bayes=fast)
                shift = (per_query - plain)[rows]
        estimate = float(per_query[rows].mean())
        joint, sample_only = [], []
        for b in range(n_rep):
            if keys is None:  # each query's kept scores resampled on their own
                weight = torch.poisson(finite, generator=gen)
            else:  # one multiplicity per distractor, shared by every query
                weight = poisson_multiplicities(keys, b, self.seed) * finite
            pq = self.per_query(estimator, gallery_size, rank_law, weight=weight, bayes=fast)
            pq = pq[rows] + shift
            sample_only.append(pq.mean())
            pick = torch.randint(0, rows.numel(), (rows.numel(),), generator=gen)
            joint.append(pq[pick].mean())
        # Centred on the prediction: reweighting the few sampled distractors above a
        # positive shifts the replicates' mean (a count of 1 becomes 0 in 37% of
        # them), which is the resampling's artefact, not the estimator's bias.
        # Normal width from the replicates' sd: stable with the few replicates
        # that an expensive estimator affords (percentiles of 25 are extremes).
        half = NormalDist().inv_cdf(0.5 + confidence / 2) * float(torch.stack(joint).std())
        return (estimate - half, estimate + half), float(torch.stack(sample_only).std())

    def budget(
        self,
        estimator: str,
        gallery_size: int,
        rank_law: str | None = None,
        n_boot: int = 1000,
        confidence: float = 0.95,
        ci: tuple[float, float] | None = None,
    ) -> dict:
        """Sufficient-budget diagnostic (paper App. D).

        Predictions from the nested sub-samples S/4, S/2 and S side by side;
        ``converged`` when their spread (max − min) is below the query
        noise, the half-width of the query-bootstrap interval at S.
        """
        fractions = self.state.fractions
        picks = [
            i for i, f in enumerate(fractions) if any(abs(f - g) < 1e-9 for g in (0.25, 0.5, 1.0))
        ]
        rows = []
        for i in picks:
            _, n = self.level(i)
            pq = self.per_query(estimator, max(gallery_size, n), rank_law, level=i)
            rows.append(
                {"fraction": fractions[i], "sample_size": n, "map": float(pq[self.query_ok].mean())}
            )
        if ci is None:
            # The check needs the query noise even when no interval was asked for.
            ci = bootstrap_ci(
                self.per_query(estimator, gallery_size, rank_law),
                max(int(n_boot), 200),
                confidence,
                self._generator(),
            )
        noise = (ci[1] - ci[0]) / 2.0
        maps = [r["map"] for r in rows]
        spread = max(maps) - min(maps) if maps else math.nan
        return {
            "levels": rows,
            "spread": spread,
            "noise": noise,
            "converged": bool(spread <= noise),
        }

    def curve(
        self,
        estimator: str,
        sizes: list[int],
        rank_law: str | None = None,
        n_boot: int = 500,
        confidence: float = 0.95,
    ) -> tuple[list[float], list[float], list[float]]:
        """Predicted mAP@k and interval at each gallery size (hardness computed once)."""
        maps, los, his = [], [], []
        for n in sizes:
            if estimator in ("single_x", *CURVE_ESTIMATORS):
                mean, (lo, hi) = self._aggregate(estimator, int(n), n_boot, confidence)
                maps.append(mean)
                los.append(lo)
                his.append(hi)
                continue
            pq = self.per_query(estimator, int(n), rank_law)
            lo, hi = bootstrap_ci(pq, n_boot, confidence, self._generator())
            maps.append(float(pq[self.query_ok].mean()))
            los.append(lo)
            his.append(hi)
        return maps, los, his

    def measured(self, n_boot: int = 500, confidence: float = 0.95) -> list[dict]:
        """The metric measured on each nested sub-sample gallery (S/8 … S)."""
        out = []
        for i, f in enumerate(self.state.fractions):
            _, n = self.level(i)
            if n == 0:
                continue
            pq = self.per_query("sample", n, level=i)
            lo, hi = bootstrap_ci(pq, n_boot, confidence, self._generator())
            out.append(
                {
                    "fraction": f,
                    "sample_size": n,
                    "map": float(pq[self.query_ok].mean()),
                    "ci": [lo, hi],
                }
            )
        return out
