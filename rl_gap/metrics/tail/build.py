"""How every entry point builds its predictor: the sample state's depth and :func:`tail_predictor`.

:func:`~rl_gap.metrics.tail.predict_map`, :class:`~rl_gap.metrics.tail.TailExtrapolatedMAP`
and ``rl-gap extrapolate`` fill a :class:`NestedTopK` their own way (a full
matrix, streamed chunks across ranks, embedding files) and then build the
same :class:`TailPredictor` here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch

from rl_gap.metrics.tail.hardness import DEFAULT_CONFIG, TailConfig, resolve_score_range
from rl_gap.metrics.tail.predictor import TailPredictor
from rl_gap.metrics.tail.registry import get_estimator
from rl_gap.metrics.tail.sampling import DEFAULT_FRACTIONS, NestedTopK


def with_score_range(config: TailConfig, score_range) -> TailConfig:
    """``config`` with the declared score range ("cosine", "dot", None or a (low, high) pair)."""
    return dataclasses.replace(config, score_range=resolve_score_range(score_range))


def state_capacity(
    k: int,
    config: TailConfig = DEFAULT_CONFIG,
    estimators: Iterable[str] | None = None,
    sample_size: int | None = None,
) -> int:
    """Scores kept per query: what k needs and what the named estimators read.

    ``estimators=None`` (a state any estimator may read later) keeps the
    paper's ``config.n_top``. Never more than ``sample_size`` when it is known.
    """
    if estimators is None:
        depth = config.n_top
    else:
        depth = max(get_estimator(name).kept_depth(config) for name in estimators)
    capacity = max(int(k), depth)
    return capacity if sample_size is None else min(capacity, int(sample_size))


def new_state(
    n_queries: int,
    k: int,
    config: TailConfig = DEFAULT_CONFIG,
    *,
    estimators: Iterable[str] | None = None,
    sample_size: int | None = None,
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS,
    keyed: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> NestedTopK:
    """An empty sample state as deep as :func:`state_capacity` asks."""
    capacity = state_capacity(k, config, estimators, sample_size)
    return NestedTopK(n_queries, capacity, fractions, dtype=dtype, keyed=keyed, device=device)


#: The predictor of every entry point, from (Q, m) positive scores and a filled state:
#: the class itself (its constructor checks the inputs and moves them to the host).
tail_predictor = TailPredictor
