"""The estimator registry: names, lookup errors, rank laws, and adding an estimator."""

from __future__ import annotations

import pytest
import torch

import rl_gap.metrics.tail as tail
from rl_gap.metrics.tail import (
    ESTIMATORS,
    HARDNESS_ESTIMATORS,
    Estimator,
    available_estimators,
    predict_map,
    register_estimator,
    registry,
)
from rl_gap.metrics.tail.registry import resolve_rank_law


def test_old_name_tuples_are_the_registry_in_order():
    assert ESTIMATORS == available_estimators() == (
        "tail", "evt", "evt_support", "count", "sample", "single_x", "powerlaw", "loguniform",
        "tail_pooled",
    )  # fmt: skip
    assert HARDNESS_ESTIMATORS == ("tail", "evt", "evt_support", "count", "tail_pooled")


def test_rank_law_is_the_estimators_own_and_predictive_only_for_tail():
    assert resolve_rank_law("tail", None) == "predictive"
    assert resolve_rank_law("evt", None) == "plugin"
    assert resolve_rank_law("count", "poisson") == "poisson"
    with pytest.raises(
        ValueError, match="'predictive' is the tail, tail_pooled estimator's, not 'evt'"
    ):
        resolve_rank_law("evt", "predictive")
    with pytest.raises(ValueError, match="unknown rank_law 'nope'"):
        resolve_rank_law("evt", "nope")


class HalfEverywhere(Estimator):
    """A toy estimator: every query's AP@k is 1/2."""

    name = "toy_half"
    summary = "AP@k = 1/2 for every query"
    cost = "nothing"

    def per_query(self, predictor, gallery_size, rank_law, level, weight, bayes):
        return torch.full((predictor.pos_sorted.shape[0],), 0.5, dtype=torch.float64)


def test_a_registered_estimator_is_served_by_predict_map(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register_estimator(HalfEverywhere())
    assert available_estimators()[-1] == "toy_half"
    pos = torch.tensor([[0.9, float("nan")], [0.8, 0.7]])
    est = predict_map(pos, torch.rand(2, 50) - 0.5, 1000, k=10, estimator="toy_half", n_boot=20)
    assert est.map == 0.5 and est.ci == (0.5, 0.5) and est.hardness is None
    with pytest.raises(ValueError, match="already registered"):
        register_estimator(HalfEverywhere())


class PerPositiveHalf(HalfEverywhere):
    name = "toy_per_positive"
    per_positive = True


def test_the_name_tuples_follow_the_registry(monkeypatch):
    """``ESTIMATORS`` / ``HARDNESS_ESTIMATORS`` are read at each access, not copied at import."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    before = tail.ESTIMATORS
    register_estimator(HalfEverywhere())
    register_estimator(PerPositiveHalf())
    assert tail.ESTIMATORS == (*before, "toy_half", "toy_per_positive")
    assert tail.HARDNESS_ESTIMATORS[-1] == "toy_per_positive"
    assert "toy_half" not in tail.HARDNESS_ESTIMATORS
    assert {"ESTIMATORS", "HARDNESS_ESTIMATORS"} <= set(dir(tail))


@pytest.mark.parametrize("name", ["single_x", "powerlaw", "tail_pooled"])
def test_an_estimator_needs_no_other_registered_name(monkeypatch, name):
    """What an estimator reads of another (the sample's own AP@k, evt_support's hardness) it
    computes itself: with only it registered, the prediction is the same."""
    gen = torch.Generator().manual_seed(1)
    pos = 0.6 + 0.3 * torch.rand(8, 3, generator=gen)
    sample = 0.9 * torch.rand(8, 600, generator=gen)
    sample[:4, 0] = 0.99  # a bump above the tail: tail_pooled's flag reads evt_support
    want = predict_map(pos, sample, 20_000, k=5, estimator=name, n_boot=20)
    monkeypatch.setattr(registry, "_REGISTRY", {name: registry._REGISTRY[name]})
    got = predict_map(pos, sample, 20_000, k=5, estimator=name, n_boot=20)
    assert available_estimators() == (name,)
    assert (got.map, got.ci, got.flags) == (want.map, want.ci, want.flags)
