"""evt_support: the GPD shape bound follows the declared score range."""

from __future__ import annotations

import pytest
import torch

from rl_gap.metrics.tail import predict_map
from rl_gap.metrics.tail.hardness import TailConfig, fit_tail


def _pareto_scores(Q: int, S: int, xi: float, seed: int = 0) -> torch.Tensor:
    """Exact GPD(σ = 1, ξ) scores by inversion: P(Y > y) = (1 + ξ·y)^(−1/ξ)."""
    u = torch.rand(Q, S, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (u.pow(-xi) - 1.0) / xi


def test_unbounded_heavy_tail_gets_a_positive_shape():
    sample = _pareto_scores(40, 20_000, xi=0.25)
    top = torch.sort(sample, 1, descending=True).values[:, :4000]
    heavy = fit_tail(top, 20_000, config=TailConfig(n_excess=400, xi_max=0.5))
    paper = fit_tail(top, 20_000, config=TailConfig(n_excess=400))
    # Peaks-over-threshold of a GPD is a GPD with the same ξ.
    assert float(heavy.xi.median()) == pytest.approx(0.25, abs=0.06)
    assert float(paper.xi.max()) <= 0.0  # the paper's bound cuts the heavy tail off


def test_bounded_scores_give_the_papers_evt_and_heavy_tails_are_less_optimistic():
    g = torch.Generator().manual_seed(1)
    cosine = torch.rand(30, 8000, generator=g, dtype=torch.float64) * 1.6 - 0.8
    pos = 0.79 + 0.01 * torch.rand(30, 2, generator=g, dtype=torch.float64)
    # At the same threshold (evt_support's own follows S: sample_excesses).
    same = TailConfig(n_excess=200)
    a = predict_map(pos, cosine, 80_000, k=100, estimator="evt_support", n_boot=20, config=same)
    b = predict_map(pos, cosine, 80_000, k=100, estimator="evt", n_boot=20, config=same)
    assert torch.equal(a.hardness, b.hardness)
    sample = _pareto_scores(30, 8000, xi=0.3, seed=2)
    pos = torch.quantile(sample, 1 - 1 / 16000, dim=1, keepdim=True).expand(30, 2).clone()
    a = predict_map(
        pos, sample, 160_000, k=100, estimator="evt_support", n_boot=20, score_range=None
    )
    b = predict_map(pos, sample, 160_000, k=100, estimator="evt", n_boot=20)
    # True hardness 1/16000 → N·x = 10; ξ ≤ 0 puts the endpoint below many positives.
    assert a.map < b.map
    x_true = 1 / 16000
    ratio = (a.hardness[:, 0] / x_true).log().median().exp()
    assert 0.4 < float(ratio) < 2.5
