"""TailPredictor: a prediction's data (positives and a nested top-T sample state) and its caches.

It is the :class:`~rl_gap.metrics.tail.view.TailView` the estimators and
their checks read; its ``estimate``/``run``/``budget``/``curve``/``measured``
methods are the staged run of ``pipeline`` and ``sub_samples`` with the
predictor as their view. Used by :func:`rl_gap.metrics.tail.predict_map`,
the torchmetrics class and ``rl-gap extrapolate``; see
``docs/tail_extrapolation.md`` for the estimators.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import TypeVar

import torch

from rl_gap.metrics.tail import pipeline
from rl_gap.metrics.tail.bayes import (
    DEFAULT_BAYES,
    BayesTailConfig,
    GPDPosterior,
    gpd_posterior,
)
from rl_gap.metrics.tail.hardness import (
    DEFAULT_CONFIG,
    TailConfig,
    TailFit,
    clip_to_range,
    sample_counts,
)
from rl_gap.metrics.tail.inputs import check_predictor_inputs
from rl_gap.metrics.tail.posterior_predictive import tail_precision_terms, tail_survival
from rl_gap.metrics.tail.rank_law import sort_positives
from rl_gap.metrics.tail.registry import Estimator, get_estimator
from rl_gap.metrics.tail.rows import RowView, concat_rows, fill_rows, row_slices
from rl_gap.metrics.tail.sampling import NestedTopK
from rl_gap.metrics.tail.sub_samples import budget_check, measured_on_sub_samples
from rl_gap.metrics.tail.view import PerPositive

T = TypeVar("T")

__all__ = ["TailPredictor"]


class TailPredictor:
    """A prediction's data at any gallery size: positives and a nested top-T sample state.

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
        self._memo: dict[Hashable, object] = {}
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

    def level_rows(self, index: int, rows: slice) -> tuple[torch.Tensor, int]:
        """Rows ``rows`` of :meth:`level`, sliced from the kept level or built for them alone."""
        cached = self._levels.get(index % len(self.state.fractions))
        if cached is not None:
            return cached[0][rows], cached[1]
        top, _, size = self.state.level_with_keys(index, rows)
        return top, size

    @property
    def fractions(self) -> tuple[float, ...]:
        """The nested sub-samples' fractions (S/8 … S)."""
        return self.state.fractions

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
        self,
        estimator: str | PerPositive,
        level: int = -1,
        weight: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, TailFit | GPDPosterior | None]:
        """(x, counts, fit) of a per-positive estimator (``count``, ``evt``, ``tail``…) on a level,
        a name or the estimator itself; kept for the full sample's levels without weights.

        For ``tail`` x is the posterior-mean hardness and fit the GPDPosterior.
        """
        est = get_estimator(estimator) if isinstance(estimator, str) else estimator
        key = (est.name, level % len(self.state.fractions))
        if weight is None and key in self._hardness:
            return self._hardness[key]
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
        config = bayes or self.bayes
        survival = None
        if cache:  # the same for every N: a curve over N computes it once
            fit_key = (key[0], dataclasses.replace(config, bias_replicates=0, bias_seed=0))
            survival = self.memo(
                ("tail_survival", fit_key),
                lambda: tail_survival(self.pos_sorted, self.valid, post, config),
            )
        terms, _ = tail_precision_terms(
            self.pos_sorted, self.valid, self.j, counts, post, n, gallery_size, self.k, config,
            survival,
        )  # fmt: skip
        if cache:
            self._tail_terms[key] = terms
        return terms

    def per_query(self, estimator: str | Estimator, gallery_size: int, **options) -> torch.Tensor:
        """(Q,) per-query AP@k of a named estimator; NaN for queries without positives (and for
        curve fits): :meth:`Estimator.ap` with this predictor as its view, ``options`` its
        ``rank_law``, ``level``, ``weight`` and ``bayes``, by name."""
        return get_estimator(estimator).ap(self, gallery_size, **options)

    def row_views(self) -> list[RowView] | None:
        """Blocks of query rows when the per-positive arrays exceed one block (``rows``);
        None when one block holds them."""
        width = max(self.pos_sorted.shape[1], self.state.capacity)
        blocks = row_slices(self.pos_sorted.shape[0], width)
        return None if len(blocks) == 1 else [RowView(self, rows) for rows in blocks]

    def memo(self, key: Hashable, build: Callable[[], T]) -> T:
        """``build()`` once per predictor (an estimator's or a check's data that does not
        depend on N)."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def generator(self, offset: int = 0) -> torch.Generator:
        """A fresh CPU generator from the predictor's seed (+ ``offset``)."""
        return torch.Generator().manual_seed(self.seed + offset)

    # The staged run (``pipeline``), as methods: each is the pipeline's function, this
    # predictor its view.
    estimate = pipeline.estimate
    run = pipeline.run
    budget = budget_check
    curve = pipeline.curve
    measured = measured_on_sub_samples
