"""Input checks: each bad input is one ValueError naming it."""

from __future__ import annotations

import pytest
import torch

from rl_gap.metrics.tail.inputs import (
    check_positive_scores,
    check_predictor_inputs,
    check_sample_matrix,
    resolve_request,
)
from rl_gap.metrics.tail.sampling import NestedTopK


def test_a_request_is_checked_once_with_the_rank_law_resolved():
    request = resolve_request("tail", 100, 10, 5)
    assert (request.name, request.rank_law, request.gallery_size) == ("tail", "predictive", 100)
    cases = [
        (("evt", 100, 10, 5), {"n_boot": -1}, "n_boot must be an integer >= 0"),
        (("nope", 100, 10, 5), {}, "unknown estimator 'nope'"),
        (("evt", 100, 10, 0), {}, "k must be >= 1"),
        (("evt", 100, 0, 5), {}, "the distractor sample is empty"),
        (("evt", 9, 10, 5), {}, r"gallery_size \(9\) must be >= the distractor sample size \(10\)"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            resolve_request(*args, **kwargs)


def test_scores_and_state_are_checked():
    with pytest.raises(ValueError, match="pos_scores must be a"):
        check_positive_scores(torch.zeros(3))
    with pytest.raises(ValueError, match="pos_scores has 2 queries, the sample scores 3"):
        check_positive_scores(torch.zeros(2, 1), 3)
    with pytest.raises(ValueError, match="sample_scores must be floating point"):
        check_sample_matrix(torch.zeros(2, 3, dtype=torch.long))
    state = NestedTopK(2, 3)
    state.push(torch.rand(2, 10), 0)
    with pytest.raises(ValueError, match="the state keeps 3 scores per query"):
        check_predictor_inputs(torch.zeros(2, 1), state, 5)
