"""evt_support's sample-size-aware threshold, its threshold check and the bump flag."""

from __future__ import annotations

import math

import pytest
import torch

from rl_gap.metrics.tail import predict_map
from rl_gap.metrics.tail.hardness import (
    DEFAULT_CONFIG,
    gpd_hardness,
    sample_excesses,
    sample_n_top,
)
from rl_gap.metrics.tail.registry import get_estimator


def support_gpd_hardness(pos, valid, top, n_sample):
    """``evt_support``'s hardness at the default settings."""
    est = get_estimator("evt_support")
    return est.estimate_hardness(pos, valid, top, n_sample, None, DEFAULT_CONFIG)


def _sorted_top(Q: int, T: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # Scores with a bounded (Beta-like) upper tail in [0, 1).
    s = 1.0 - torch.rand(Q, T, generator=g, dtype=torch.float64).pow(0.3) * 0.5
    return torch.sort(s, 1, descending=True).values


@pytest.mark.parametrize(
    "n_sample,expected",
    [
        (1_000_000, 200),
        (3_000_000, 200),
        (100_000_000, 200),
        (100_000, 63),
        (20_000, 28),
        (10_000, 20),
    ],
)
def test_threshold_rule_is_the_papers_in_the_millions_and_sqrt_below(n_sample, expected):
    # Paper (App. B): the 95th percentile of the top 4,000 = 200 exceedances.
    assert sample_excesses(n_sample) == expected
    paper = max(10, round(0.05 * 4000 * min(1.0, math.sqrt(n_sample / 1e6))))
    assert sample_excesses(n_sample) == paper
    if n_sample >= 1_000_000:
        assert sample_n_top(n_sample) == 4000


@pytest.mark.parametrize("n_sample", [10_000, 100_000, 2_000_000])
def test_fit_thresholds_at_the_rule_and_evt_keeps_the_papers_constants(n_sample):
    top = _sorted_top(6, 4000)
    pos = top[:, :2] + 1e-3  # above every sampled score: the tail decides
    valid = torch.ones_like(pos, dtype=torch.bool)
    n = sample_excesses(n_sample)
    _, _, fit = support_gpd_hardness(pos, valid, top, n_sample)
    # The threshold is the (n+1)-th largest score, n exceedances above it.
    assert torch.equal(fit.threshold, top[:, n])
    assert torch.allclose(fit.zeta, torch.full((6,), n / n_sample, dtype=torch.float64))
    _, _, paper = gpd_hardness(pos, valid, top, n_sample)
    assert torch.equal(paper.threshold, top[:, 200])
    if n_sample >= 1_000_000:  # the same estimator as the paper's there
        x_rule, _, _ = support_gpd_hardness(pos, valid, top, n_sample)
        x_paper, _, _ = gpd_hardness(pos, valid, top, n_sample, config=DEFAULT_CONFIG)
        assert torch.equal(x_rule, x_paper)


def _bump_world(Q=80, S=10_000, m=3, seed=0):
    """Cosine-like scores, plus one near-copy at the positives' level in a third of the queries."""
    g = torch.Generator().manual_seed(seed)
    sample = 0.6 * torch.rand(Q, S, generator=g, dtype=torch.float64).pow(3.0)
    pos = 0.58 + 0.02 * torch.rand(Q, m, generator=g, dtype=torch.float64)
    copies = torch.arange(Q) % 3 == 0
    sample[copies, 0] = 0.95
    return pos, sample, copies


def test_a_bump_above_the_tail_is_flagged_and_bounds_ci_total():
    pos, sample, copies = _bump_world()
    est = predict_map(pos, sample, 200_000, k=100, n_boot=200, estimator="evt_support")
    assert any(f.startswith("bump above the tail") for f in est.flags)
    diag = est.diagnostics
    assert diag.outlier_share == pytest.approx(float(copies.double().mean()), abs=0.02)
    # The bound: every positive's hardness raised by the pooled copy rate share / S, plugin ranks.
    x = est.hardness + diag.outlier_share / sample.shape[1]
    j = torch.arange(1, 4, dtype=torch.float64)
    rank = j + 200_000 * x
    ap = ((j / rank) * (rank <= 100)).sum(1) / 3
    assert diag.bump_bound == pytest.approx(float(ap.mean()), abs=1e-9)
    assert est.ci_total[0] <= diag.bump_bound < est.map
    clean = predict_map(pos, sample[:, 1:], 200_000, k=100, n_boot=200, estimator="evt_support")
    assert not any(f.startswith("bump") for f in clean.flags)
    assert clean.diagnostics.bump_bound is None


def test_threshold_flag_fires_exactly_when_a_refit_moves_past_the_query_noise():
    pos, sample, _ = _bump_world(seed=1)
    assert sample_excesses(2_000) == 10  # the fit's minimum, not round(8.9)
    for S in (2_000, 9_000):
        est = predict_map(
            pos, sample[:, 1 : S + 1], 100 * S, k=100, n_boot=200, estimator="evt_support"
        )
        diag = est.diagnostics
        n = sample_excesses(S)
        assert sorted(diag.threshold_maps) == sorted({max(10, n // 2), max(10, n), 2 * n})
        moved = max(abs(v - diag.threshold_maps[max(10, n)]) for v in diag.threshold_maps.values())
        flagged = any(f.startswith("threshold-unstable") for f in est.flags)
        assert flagged == (moved > diag.budget_noise)
        assert diag.threshold_maps[max(10, n)] == pytest.approx(est.map, abs=1e-12)
