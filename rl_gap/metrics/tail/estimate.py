"""Former home of the result type, the estimator names and the bootstrap (import path kept).

``TailEstimate`` lives in ``results``, the estimator registry in ``registry``
(names in ``estimators``), intervals in ``intervals``, input checks in ``inputs``.
"""

from __future__ import annotations

from rl_gap.metrics.tail.inputs import check_positive_scores
from rl_gap.metrics.tail.intervals import bootstrap_ci, check_n_boot, percentile_interval
from rl_gap.metrics.tail.registry import (
    DEFAULT_ESTIMATOR,
    PREDICTIVE,
    available_estimators,
    get_estimator,
    resolve_rank_law,
)
from rl_gap.metrics.tail.results import TailEstimate

#: Every ``estimator=`` name (the registry's, in registration order).
ESTIMATORS = available_estimators()
#: Estimators built on per-positive hardness (they have ``hardness`` and the budget diagnostic).
HARDNESS_ESTIMATORS = tuple(name for name in ESTIMATORS if get_estimator(name).per_positive)

__all__ = [
    "DEFAULT_ESTIMATOR",
    "ESTIMATORS",
    "HARDNESS_ESTIMATORS",
    "PREDICTIVE",
    "TailEstimate",
    "bootstrap_ci",
    "check_n_boot",
    "check_positive_scores",
    "percentile_interval",
    "resolve_rank_law",
]
