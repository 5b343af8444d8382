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


@pytest.mark.parametrize(
    "estimator, options",
    [
        ("tail_pooled", {}),
        ("evt", {"nested_boot": 3, "budget": True}),
        ("single_x", {}),
    ],
)
def test_predict_map_checks_each_input_once(monkeypatch, estimator, options):
    """check_sample_matrix, check_k and check_n_boot run once per call, wherever a module of
    the package holds them."""
    import sys

    from rl_gap.metrics.tail import inputs, intervals, predict_map

    calls = {}
    for check in (inputs.check_sample_matrix, inputs.check_k, intervals.check_n_boot):
        calls[check.__name__] = 0

        def counted(*args, _check=check, **kwargs):
            calls[_check.__name__] += 1
            return _check(*args, **kwargs)

        for name, module in list(sys.modules.items()):
            if (
                name.startswith("rl_gap.metrics.tail")
                and getattr(module, check.__name__, None) is check
            ):
                monkeypatch.setattr(module, check.__name__, counted)
    gen = torch.Generator().manual_seed(0)
    pos = 0.5 + 0.2 * torch.rand(6, 2, generator=gen)
    sample = torch.rand(6, 400, generator=gen) * 0.9
    predict_map(pos, sample, 4000, k=5, estimator=estimator, n_boot=20, **options)
    assert calls == {"check_sample_matrix": 1, "check_k": 1, "check_n_boot": 1}
