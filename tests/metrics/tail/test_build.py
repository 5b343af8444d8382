"""One builder for every entry point: the state's depth per estimator, and the predictor."""

from __future__ import annotations

import torch

from rl_gap.metrics.tail import TailPredictor, tail_predictor
from rl_gap.metrics.tail.build import new_state, state_capacity, with_score_range
from rl_gap.metrics.tail.hardness import TailConfig


def test_depth_is_what_k_and_the_named_estimators_read_capped_at_the_sample():
    config = TailConfig()
    assert state_capacity(1000, config) == 4000  # any estimator later: the paper's top 4,000
    assert state_capacity(5000, config) == 5000
    assert state_capacity(1000, config, ["evt_support"]) == 1000  # k over 2·400 + 1
    assert state_capacity(10, config, ["count", "sample"]) == 801  # the threshold checks' depth
    assert state_capacity(10, config, ["count", "evt"]) == 4000
    assert state_capacity(10, config, ["evt"], sample_size=300) == 300


def test_new_state_and_predictor():
    state = new_state(3, 10, estimators=["count"], keyed=True)
    assert state.top.shape == (4, 3, 801) and state.keys is not None
    state.push(torch.rand(3, 50), 0, torch.arange(50))
    pos = torch.tensor([[0.9], [0.5], [float("nan")]])
    predictor = tail_predictor(pos, state, 10)
    assert isinstance(predictor, TailPredictor) and predictor.n_excluded == 1
    assert with_score_range(TailConfig(), "dot").score_range is None
    assert with_score_range(TailConfig(), (0, 1)).score_range == (0.0, 1.0)
