"""Each estimator carries its own flags; ``n_boot=0`` asks for no interval."""

from __future__ import annotations

import pytest
import torch

from rl_gap.metrics.tail import TailExtrapolatedMAP, predict_map
from rl_gap.metrics.tail.rank_law import ap_at_k_from_counts, sort_positives


def _bump_world(Q=150, S=20_000, m=3, seed=0):
    """A normal bulk plus a rare tight bump above it: the threshold refits disagree."""
    g = torch.Generator().manual_seed(seed)
    sample = torch.randn(Q, S, generator=g, dtype=torch.float64)
    bump = torch.rand(Q, S, generator=g) < 2e-4
    sample[bump] = 4.6 + 0.15 * torch.randn(int(bump.sum()), generator=g, dtype=torch.float64)
    pos = 4.5 + 0.3 * torch.randn(Q, m, generator=g, dtype=torch.float64)
    return pos, sample


def test_count_is_not_flagged_for_the_tail_fit():
    pos, sample = _bump_world(Q=60)
    evt = predict_map(pos, sample, 400_000, k=1000, estimator="evt", n_boot=100)
    assert len(evt.diagnostics.threshold_maps) == 5 and evt.flags
    count = predict_map(pos, sample, 400_000, k=1000, estimator="count", n_boot=100, budget=True)
    # count has no threshold: its only check is its own S/4 · S/2 · S budget.
    assert count.diagnostics.threshold_maps == {}
    assert all(f.startswith("budget not converged") for f in count.flags)
    assert count.diagnostics.budget_spread == pytest.approx(count.budget["spread"], abs=1e-12)
    converged = count.budget["spread"] <= (count.ci[1] - count.ci[0]) / 2
    assert (count.flags == []) == converged


def test_n_boot_zero_gives_no_interval_and_the_same_prediction():
    pos, sample = _bump_world(Q=40, S=5000)
    for name in ("count", "evt", "sample", "powerlaw", "single_x"):
        with_ci = predict_map(pos, sample, 100_000, k=100, estimator=name, n_boot=50)
        none = predict_map(pos, sample, 100_000, k=100, estimator=name, n_boot=0)
        assert none.ci is None and with_ci.ci is not None
        assert none.map == pytest.approx(with_ci.map, abs=1e-12)
        assert none.to_dict()["ci"] is None
        if none.diagnostics is not None:
            assert none.ci_total is None and none.to_dict()["ci_total"] is None
    # The count prediction at N = S is the sample's own mAP@k, by brute force.
    _, valid, j = sort_positives(pos)
    ranks = (sample.unsqueeze(1) >= pos.sort(1, descending=True).values.unsqueeze(2)).sum(2)
    truth = ap_at_k_from_counts(j, valid, ranks.double(), 100).mean()
    none = predict_map(pos, sample, 5000, k=100, estimator="count", n_boot=0)
    assert none.map == pytest.approx(float(truth), abs=1e-12)
    with pytest.raises(ValueError, match="n_boot must be an integer >= 0"):
        predict_map(pos, sample, 100_000, k=100, n_boot=-1)


def test_metric_logs_nan_bounds_without_an_interval():
    pos, sample = _bump_world(Q=20, S=3000)
    metric = TailExtrapolatedMAP(gallery_size=60_000, k=100, n_boot=0, score_range="dot")
    q = torch.eye(20, 8, dtype=torch.float32)
    metric.update(
        queries=q, positives=q.repeat(2, 1) * 0.9, positive_query=torch.arange(20).repeat(2)
    )
    metric.update(distractors=torch.randn(3000, 8))
    out = metric.compute()
    assert torch.isnan(out["ci_low"]) and torch.isnan(out["ci_high"])
    assert 0.0 <= float(out["map"]) <= 1.0
