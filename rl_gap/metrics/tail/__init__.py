"""Tail-extrapolated mAP@k: predict a web-scale gallery's metric from a small distractor sample.

*Web Scale on a Budget: Tail-Aware Retrieval Evaluation* (Meivar & Avidan); definitions in
docs/definitions.md ("Per-query hardness"), estimators in docs/tail_extrapolation.md.

The modules, in the order a prediction runs through them:

- ``sampling``: the deterministic hash sampler and the streaming nested top-T state.
- ``from_scores``: :func:`predict_map`, the one-call entry on a full (Q, S) sample matrix.
- ``build``: the state's depth and :func:`tail_predictor`, the one builder every entry uses.
- ``inputs``: the input checks, each made once, and the checked :class:`EstimateRequest`.
- ``predictor``: :class:`TailPredictor`, a prediction's data and its caches.
- ``pipeline``: the staged run (fit, interval, joint bootstrap, budget, checks).
- ``view``: what the maths read of a prediction's data (``TailView``, a Protocol).
- ``registry``: :class:`Estimator`, ``available_estimators()``, ``get_estimator(name)``.
- ``estimators``: the built-in estimators, each an object registered by name.
- ``gpd``: the vectorised generalised-Pareto fit of the sample's tail.
- ``hardness``: per-positive hardness x from sampled counts or the fitted tail (``evt``).
- ``bayes``, ``posterior_predictive``, ``bias``: the ``tail`` estimator's posterior over
  the shape ξ, its predictive E[AP@k] and its bias correction.
- ``rank_law``: AP@k from hardness (plug-in ranks, Binomial/Poisson expectations).
- ``baselines``: the paper's curve baselines (``single_x``, ``powerlaw``, ``loguniform``).
- ``intervals``: the query bootstrap.
- ``sub_samples``: the metric measured on the nested sub-samples, the sufficient-budget check.
- ``uncertainty``: the joint (queries × sample) bootstrap and the fixed-query interval.
- ``diagnostics``: the threshold-stability and bump checks (``flags``).
- ``results``: :class:`TailEstimate` and its :class:`Diagnostics`, what a prediction returns.
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
    "DEFAULT_ESTIMATOR": ".registry",
    "DEFAULT_FRACTIONS": ".sampling",
    "BayesTailConfig": ".bayes",
    "Estimator": ".registry",
    "NestedTopK": ".sampling",
    "TailConfig": ".hardness",
    "TailEstimate": ".results",
    "TailExtrapolatedMAP": ".metric",
    "TailPredictor": ".predictor",
    "available_estimators": ".registry",
    "bootstrap_ci": ".intervals",
    "check_positive_scores": ".inputs",
    "get_estimator": ".registry",
    "hash_uniform": ".sampling",
    "plot_extrapolation": ".plot",
    "predict_map": ".from_scores",
    "register_estimator": ".registry",
    "state_from_scores": ".from_scores",
    "tail_predictor": ".build",
}
_lazy_getattr, _lazy_dir = lazy_exports(__name__, globals(), _EXPORTS)
#: Names read from the registry at each access (an estimator registered later is in them).
_LIVE = {"ESTIMATORS": "available_estimators", "HARDNESS_ESTIMATORS": "hardness_estimators"}


def __getattr__(name: str):
    if name in _LIVE:
        from rl_gap.metrics.tail import registry

        return getattr(registry, _LIVE[name])()
    return _lazy_getattr(name)


def __dir__() -> list[str]:
    return sorted({*_lazy_dir(), *_LIVE})


# The built-in estimators register themselves on import: any use of the registry
# (``get_estimator("evt")``, the command, ``predict_map``) goes through this package.
from rl_gap.metrics.tail import estimators as _builtin_estimators  # noqa: E402, F401

__all__ = [
    "BayesTailConfig",
    "DEFAULT_BAYES",
    "DEFAULT_CONFIG",
    "DEFAULT_ESTIMATOR",
    "DEFAULT_FRACTIONS",
    "ESTIMATORS",
    "Estimator",
    "HARDNESS_ESTIMATORS",
    "NestedTopK",
    "TailConfig",
    "TailEstimate",
    "TailExtrapolatedMAP",
    "TailPredictor",
    "available_estimators",
    "bootstrap_ci",
    "check_positive_scores",
    "get_estimator",
    "hash_uniform",
    "plot_extrapolation",
    "predict_map",
    "register_estimator",
    "state_from_scores",
    "tail_predictor",
]

if TYPE_CHECKING:
    from rl_gap.metrics.tail.bayes import DEFAULT_BAYES, BayesTailConfig
    from rl_gap.metrics.tail.build import tail_predictor
    from rl_gap.metrics.tail.from_scores import predict_map, state_from_scores
    from rl_gap.metrics.tail.hardness import DEFAULT_CONFIG, TailConfig
    from rl_gap.metrics.tail.inputs import check_positive_scores
    from rl_gap.metrics.tail.intervals import bootstrap_ci
    from rl_gap.metrics.tail.metric import TailExtrapolatedMAP
    from rl_gap.metrics.tail.plot import plot_extrapolation
    from rl_gap.metrics.tail.predictor import TailPredictor
    from rl_gap.metrics.tail.registry import (
        DEFAULT_ESTIMATOR,
        Estimator,
        available_estimators,
        get_estimator,
        register_estimator,
    )
    from rl_gap.metrics.tail.results import TailEstimate
    from rl_gap.metrics.tail.sampling import DEFAULT_FRACTIONS, NestedTopK, hash_uniform
