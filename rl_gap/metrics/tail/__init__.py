"""Tail-extrapolated mAP@k: predict a web-scale gallery's metric from a small distractor sample.

*Web Scale on a Budget: Tail-Aware Retrieval Evaluation* (Meivar & Avidan); definitions in
docs/definitions.md ("Per-query hardness"), estimators in docs/tail_extrapolation.md.

The modules, in the order a prediction runs through them:

- ``sampling``: the deterministic hash sampler and the streaming nested top-T state.
- ``gpd``: the vectorised generalised-Pareto fit of the sample's tail.
- ``hardness``: per-positive hardness x from sampled counts or the fitted tail (``evt``).
- ``bayes``: the GPD posterior over the shape ξ (the ``tail`` estimator).
- ``predictive`` (with ``bias``): the posterior-predictive survival and E[AP@k].
- ``rank_law``: AP@k from hardness (plug-in ranks, Binomial/Poisson expectations).
- ``baselines``: the paper's curve baselines (``single_x``, ``powerlaw``, ``loguniform``).
- ``estimate``: the result type, the estimator registry ``ESTIMATORS`` and bootstrap intervals.
- ``predictor``: :class:`TailPredictor`, every estimator from positives and a sample state.
- ``predict``: :func:`predict_map`, the one-call entry on a full (Q, S) sample matrix.
- ``metric``: :class:`TailExtrapolatedMAP`, the streaming torchmetrics class (DDP-synced).
- ``plot``: the ``rl-gap extrapolate --plot`` figure.

```python
from rl_gap.metrics.tail import predict_map
est = predict_map(pos_scores, sample_scores, gallery_size=N, k=1000)  # DEFAULT_ESTIMATOR
est.map, est.ci, est.per_query
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl_gap.lazy import lazy_exports

# Names load on first use: `rl-gap extrapolate` does not import torchmetrics (``metric``)
# or matplotlib (``plot``) until it needs them.
_EXPORTS = {
    "DEFAULT_BAYES": ".bayes",
    "DEFAULT_CONFIG": ".hardness",
    "DEFAULT_ESTIMATOR": ".estimate",
    "DEFAULT_FRACTIONS": ".sampling",
    "ESTIMATORS": ".estimate",
    "HARDNESS_ESTIMATORS": ".estimate",
    "BayesTailConfig": ".bayes",
    "NestedTopK": ".sampling",
    "TailConfig": ".hardness",
    "TailEstimate": ".estimate",
    "TailExtrapolatedMAP": ".metric",
    "TailPredictor": ".predictor",
    "bootstrap_ci": ".estimate",
    "check_positive_scores": ".estimate",
    "hash_uniform": ".sampling",
    "plot_extrapolation": ".plot",
    "predict_map": ".predict",
    "state_from_scores": ".predict",
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = [
    "DEFAULT_BAYES",
    "DEFAULT_CONFIG",
    "DEFAULT_ESTIMATOR",
    "DEFAULT_FRACTIONS",
    "ESTIMATORS",
    "HARDNESS_ESTIMATORS",
    "BayesTailConfig",
    "NestedTopK",
    "TailConfig",
    "TailEstimate",
    "TailExtrapolatedMAP",
    "TailPredictor",
    "bootstrap_ci",
    "check_positive_scores",
    "hash_uniform",
    "plot_extrapolation",
    "predict_map",
    "state_from_scores",
]

if TYPE_CHECKING:
    from rl_gap.metrics.tail.bayes import DEFAULT_BAYES, BayesTailConfig
    from rl_gap.metrics.tail.estimate import (
        DEFAULT_ESTIMATOR,
        ESTIMATORS,
        HARDNESS_ESTIMATORS,
        TailEstimate,
        bootstrap_ci,
        check_positive_scores,
    )
    from rl_gap.metrics.tail.hardness import DEFAULT_CONFIG, TailConfig
    from rl_gap.metrics.tail.metric import TailExtrapolatedMAP
    from rl_gap.metrics.tail.plot import plot_extrapolation
    from rl_gap.metrics.tail.predict import predict_map, state_from_scores
    from rl_gap.metrics.tail.predictor import TailPredictor
    from rl_gap.metrics.tail.sampling import DEFAULT_FRACTIONS, NestedTopK, hash_uniform
