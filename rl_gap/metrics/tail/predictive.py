"""Former name of ``posterior_predictive`` (the ``tail`` estimator's E[AP@k]); import path kept."""

from rl_gap.metrics.tail.posterior_predictive import (  # noqa: F401
    bootstrap_bias,
    tail_expected_ap,
    tail_precision_terms,
    tail_survival,
)
