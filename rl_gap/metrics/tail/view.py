"""What the tail maths read of a prediction's data: two read-only views (``typing.Protocol``).

Estimators, intervals, budget checks, diagnostics and the fixed-query
uncertainty take a view, never the predictor class: :class:`RowsView` is the
per-query data of some rows (a whole predictor, or a block of its rows,
``rows.RowView``); :class:`TailView` adds the nested levels' keys, the caches
an estimator may share with its checks, and the seeded generators. The
:class:`~rl_gap.metrics.tail.predictor.TailPredictor` satisfies both.

This module imports nothing of the package above it, so every maths module may
name these types.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Protocol, TypeVar

import torch

if TYPE_CHECKING:
    from rl_gap.metrics.tail.bayes import BayesTailConfig, GPDPosterior
    from rl_gap.metrics.tail.hardness import TailConfig

T = TypeVar("T")
#: (x, counts, fit) of a per-positive estimator: (Q, m) hardness, (Q, m) sampled counts, its fit.
Hardness = tuple[torch.Tensor, torch.Tensor, object]


class RowsView(Protocol):
    """The per-query data of a prediction's rows (positives sorted descending, NaN-padded).

    Attributes:
        pos_sorted: (Q, m) positive scores, sorted descending.
        valid: (Q, m) real-positive mask.
        j: (Q, m) 1-based rank of each positive among the query's positives.
        query_ok: (Q,) queries with at least one positive.
        k: AP cut-off.
        config, bayes: the EVT and ``tail`` settings.
        sample_size: S, the distractor sample's size.
    """

    pos_sorted: torch.Tensor
    valid: torch.Tensor
    j: torch.Tensor
    query_ok: torch.Tensor
    k: int
    config: TailConfig
    bayes: BayesTailConfig
    sample_size: int

    def level(self, index: int = -1) -> tuple[torch.Tensor, int]:
        """(top (Q, T) sorted descending, size) of nested sub-sample ``index``."""
        ...

    def level_size(self, index: int = -1) -> int:
        """The size of nested sub-sample ``index``."""
        ...

    def row_views(self) -> list[RowBlock] | None:
        """Blocks of rows when the per-positive arrays exceed one block, else None."""
        ...


class RowBlock(RowsView, Protocol):
    """Rows ``rows`` of a view, with the bootstrap weights' matching rows."""

    rows: slice

    def weight(self, weight: torch.Tensor | None) -> torch.Tensor | None:
        """These rows of a (Q, T) weight (None passes)."""
        ...


class PerPositive(Protocol):
    """What :meth:`TailView.hardness` reads of an estimator: its name (the cache key), whether its
    rows are separable, and its hardness on a view."""

    name: str
    separable_rows: bool

    def hardness(self, view: RowsView, level: int, weight: torch.Tensor | None) -> Hardness:
        """(x, counts, fit) on nested level ``level``."""
        ...


class TailView(RowsView, Protocol):
    """A whole prediction's data: the rows, the nested levels and the shared caches.

    Attributes:
        seed: the bootstrap seed (keyed resamples draw from it).
        fractions: the nested sub-samples' fractions (S/8 … S).
    """

    seed: int

    @property
    def fractions(self) -> tuple[float, ...]: ...

    def level_keys(self, index: int = -1) -> torch.Tensor | None:
        """(Q, T) distractor keys aligned with :meth:`level` (None if the state has none)."""
        ...

    def level_rows(self, index: int, rows: slice) -> tuple[torch.Tensor, int]:
        """Rows ``rows`` of :meth:`level`, sliced from the cache or built for them alone."""
        ...

    def clip_to_declared_range(self) -> None:
        """Clip the positives and the sample to ``config.score_range`` (once)."""
        ...

    def hardness(
        self, estimator: PerPositive, level: int = -1, weight: torch.Tensor | None = None
    ) -> Hardness:
        """``estimator``'s (x, counts, fit), cached on the full sample, a block of rows at a time
        where its rows are separable."""
        ...

    def tail_fit(
        self,
        level: int = -1,
        weight: torch.Tensor | None = None,
        bayes: BayesTailConfig | None = None,
    ) -> tuple[torch.Tensor, GPDPosterior]:
        """(sampled counts, GPD posterior) on a level, cached without weights."""
        ...

    def tail_terms(
        self,
        gallery_size: int,
        level: int = -1,
        weight: torch.Tensor | None = None,
        bayes: BayesTailConfig | None = None,
    ) -> torch.Tensor:
        """(Q, m) predictive E[precision] of each sorted positive, cached without weights."""
        ...

    def memo(self, key: Hashable, build: Callable[[], T]) -> T:
        """``build()`` once per prediction's data."""
        ...

    def generator(self, offset: int = 0) -> torch.Generator:
        """A fresh CPU generator from the seed (+ ``offset``)."""
        ...
