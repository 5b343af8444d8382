"""The tail estimators by name: :class:`Estimator` and the registry every entry point reads.

An estimator is one object registered under its ``estimator=`` name. It says
what it predicts from (per-positive hardness or the mAP curve), how its
per-query values become a mean with an interval, which rank laws it takes,
which checks apply to it, how many top scores per query it reads, and what it
costs. :func:`predict_map`, :class:`TailExtrapolatedMAP` and ``rl-gap
extrapolate`` look estimators up here and nowhere else; adding one is a
subclass plus :func:`register_estimator` (``docs/tail_extrapolation.md``,
"Add an estimator").
"""

from __future__ import annotations

import abc
import math
from typing import TYPE_CHECKING

import torch

from rl_gap.metrics.tail.intervals import query_bootstrap
from rl_gap.metrics.tail.rank_law import RANK_LAWS

if TYPE_CHECKING:
    from rl_gap.metrics.tail.bayes import BayesTailConfig
    from rl_gap.metrics.tail.hardness import TailConfig
    from rl_gap.metrics.tail.results import Diagnostics
    from rl_gap.metrics.tail.view import Hardness, RowsView, TailView

#: Exceedance counts of the threshold-stability refits (``diagnostics``).
THRESHOLD_EXCESSES: tuple[int, ...] = (25, 50, 100, 200, 400)
#: The rank law of the ``tail`` estimator: its own posterior-predictive E[AP@k].
PREDICTIVE = "predictive"
#: ``estimator=`` when none is named (chosen on held-out worlds, docs/tail_validation.md).
DEFAULT_ESTIMATOR = "tail_pooled"


class Estimator(abc.ABC):
    """One tail estimator: per-query AP@k at gallery size N from a prediction's data.

    Every method reads the data through a :class:`~rl_gap.metrics.tail.view.TailView`
    (``view``): the positives, the nested levels, and the caches it shares with
    its checks (``view.hardness(self)``, ``view.tail_terms``, ``view.memo``).

    Class attributes (a subclass sets what differs):
        name: the ``estimator=`` name.
        summary: one line saying what it predicts from.
        cost: what a prediction costs, relative to scoring the sample.
        per_positive: built on per-positive hardness: it has ``hardness``, the
            sufficient-budget check and the diagnostics (``flags``).
        joint_bootstrap: takes ``nested_boot`` (distractor sample resampled).
        realized: predicts the sample gallery's own metric (N = S), not N's.
        rank_laws: the ``rank_law=`` values it accepts; ``own_rank_law`` is ``None``'s.
        separable_rows: each query's values depend on its own rows alone, so they
            may be computed a block of queries at a time (``rows``).
        fixed_query_interval: ``ci`` is the interval for the fixed query set
            (distractor sample resampled, threshold refitted: ``uncertainty``) and
            its flags say by how much it may be off; ``hardness`` then takes the
            ``factor`` (scaling its exceedances) and ``coarse`` keywords. Otherwise
            ``ci`` is the interval over queries.
    """

    name: str = ""
    summary: str = ""
    cost: str = ""
    per_positive: bool = False
    joint_bootstrap: bool = False
    realized: bool = False
    rank_laws: tuple[str, ...] = RANK_LAWS
    own_rank_law: str = "plugin"
    separable_rows: bool = False
    fixed_query_interval: bool = False

    def kept_depth(self, config: TailConfig) -> int:
        """Top scores per query this estimator and its checks read (the state's depth).

        By default what the threshold checks read: twice the deepest refit, plus the threshold.
        """
        return 2 * max(THRESHOLD_EXCESSES) + 1

    @abc.abstractmethod
    def per_query(
        self,
        view: TailView,
        gallery_size: int,
        rank_law: str,
        level: int,
        weight: torch.Tensor | None,
        bayes: BayesTailConfig | None,
    ) -> torch.Tensor:
        """(Q,) AP@k of every query (rows without positives are masked by :meth:`ap`)."""

    def ap(
        self,
        view: TailView,
        gallery_size: int,
        rank_law: str | None = None,
        level: int = -1,
        weight: torch.Tensor | None = None,
        bayes: BayesTailConfig | None = None,
    ) -> torch.Tensor:
        """(Q,) per-query AP@k of :meth:`per_query` at the resolved rank law; NaN for queries
        without positives.

        ``bayes`` overrides the ``tail`` settings for this call (posterior and bias correction).
        """
        ap = self.per_query(
            view, gallery_size, resolve_rank_law(self, rank_law), level, weight, bayes
        )
        return torch.where(view.query_ok, ap, torch.full_like(ap, math.nan))

    def point_and_interval(
        self,
        view: TailView,
        gallery_size: int,
        per_query: torch.Tensor,
        n_boot: int,
        confidence: float,
    ) -> tuple[float, tuple[float, float] | None]:
        """mAP@k and its query-bootstrap interval (per-query values fixed, queries resampled;
        ``n_boot`` checked by the request)."""
        mean = float(per_query[view.query_ok].mean())
        return mean, query_bootstrap(per_query, n_boot, confidence, view.generator())

    def hardness(self, view: RowsView, level: int, weight: torch.Tensor | None) -> Hardness:
        """(x, counts, fit) of a ``per_positive`` estimator on nested level ``level``."""
        raise ValueError(f"{self.name!r} has no per-positive hardness")

    def bump_hardness(self, view: TailView) -> torch.Tensor:
        """(Q, m) the hardness a bump of outlying top scores is added to
        (``diagnostics.bump_bound``): by default the estimator's own."""
        return view.hardness(self)[0]

    def checked_as(self, rank_law: str) -> tuple[Estimator, str] | None:
        """(estimator, rank law) whose diagnostics check this one; None: no checks."""
        return (self, rank_law) if self.per_positive else None

    def check_threshold(
        self, view: TailView, gallery_size: int, noise: float, per_thr, out: Diagnostics
    ) -> None:
        """Add this estimator's threshold-stability findings to ``out`` (none by default)."""
        return None  # no threshold to check (the GPD estimators override this)

    def replicate_settings(self, view: TailView, rank_law: str) -> BayesTailConfig | None:
        """Cheaper settings for the joint-bootstrap replicates (None: the view's own)."""
        return None

    def warnings(self, view: TailView) -> list[str]:
        """Why this sample is too small for this estimator (warned, not refused)."""
        return []


_REGISTRY: dict[str, Estimator] = {}


def register_estimator(estimator: Estimator) -> Estimator:
    """Add ``estimator`` under its name (a second one with the same name is refused)."""
    if not estimator.name:
        raise ValueError(f"{type(estimator).__name__} has no name")
    if estimator.name in _REGISTRY:
        raise ValueError(f"an estimator named {estimator.name!r} is already registered")
    _REGISTRY[estimator.name] = estimator
    return estimator


def available_estimators() -> tuple[str, ...]:
    """Every registered ``estimator=`` name, in registration order."""
    return tuple(_REGISTRY)


def hardness_estimators() -> tuple[str, ...]:
    """The registered estimators built on per-positive hardness, in registration order."""
    return tuple(name for name, est in _REGISTRY.items() if est.per_positive)


def get_estimator(name: str | Estimator) -> Estimator:
    """The estimator registered as ``name`` (an :class:`Estimator` passes through)."""
    if isinstance(name, Estimator):
        return name
    if name not in _REGISTRY:
        raise ValueError(f"unknown estimator {name!r}; known: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def resolve_rank_law(estimator: str | Estimator, rank_law: str | None) -> str:
    """The rank law an estimator uses: its own for ``None``; "predictive" only for its owner."""
    est = get_estimator(estimator)
    if rank_law is None:
        return est.own_rank_law
    if rank_law == PREDICTIVE and PREDICTIVE not in est.rank_laws:
        owners = [e.name for e in _REGISTRY.values() if PREDICTIVE in e.rank_laws]
        raise ValueError(
            f"rank_law 'predictive' is the {', '.join(owners)} estimator's, not {est.name!r}'s"
        )
    if rank_law not in (*RANK_LAWS, PREDICTIVE):
        raise ValueError(
            f"unknown rank_law {rank_law!r}; known: {', '.join((*RANK_LAWS, PREDICTIVE))}"
        )
    return rank_law
