"""Parametric-bootstrap bias correction of the tail estimator (rl_gap.metrics.tail.bias).

References: exact order-statistic laws (scipy Beta), scipy's GPD quantile,
and a naive Monte Carlo of the estimator on fully drawn samples.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rl_gap.metrics.tail.bayes import BayesTailConfig, gpd_posterior
from rl_gap.metrics.tail.bias import gpd_excess_quantile, posterior_mode, smallest_uniforms
from rl_gap.metrics.tail.hardness import TailFit, sample_counts, tail_hardness
from rl_gap.metrics.tail.posterior_predictive import (
    bootstrap_bias,
    tail_positives,
    tail_precision_terms,
)
from rl_gap.metrics.tail.rank_law import expected_precision_terms, sort_positives

scipy_stats = pytest.importorskip("scipy.stats")


def test_smallest_uniforms_follow_the_beta_laws_of_order_statistics():
    n, width = 2000, 6
    u = smallest_uniforms(20_000, n, width, torch.Generator().manual_seed(0))
    assert bool((u[:, 1:] > u[:, :-1]).all())
    for i in (1, 3, 6):  # U_(i) ~ Beta(i, n + 1 − i)
        stat = scipy_stats.kstest(u[:, i - 1].numpy(), scipy_stats.beta(i, n + 1 - i).cdf)
        assert stat.pvalue > 1e-3, (i, stat)


@pytest.mark.parametrize("xi", [-0.3, 0.2])
def test_gpd_excess_quantile_matches_scipy(xi):
    p = torch.tensor([1e-6, 1e-3, 0.1, 0.5, 1.0], dtype=torch.float64)
    sigma = torch.tensor(0.7, dtype=torch.float64)
    y = gpd_excess_quantile(p, sigma, torch.tensor(xi, dtype=torch.float64))
    ref = scipy_stats.genpareto(c=xi, scale=0.7).isf(p.numpy())
    assert torch.allclose(y, torch.from_numpy(ref), rtol=1e-9, atol=1e-12)


def _naive_bias(pos, top_obs, S, N, k, config, replicates, seed):
    """Mean estimator error over fully drawn samples of the fitted tail (no order-statistic tricks)."""
    ps, valid, j = sort_positives(pos)
    post = gpd_posterior(top_obs, S, None, config)
    counts, _ = sample_counts(ps, valid, top_obs)
    use_tail = tail_positives(valid, counts, post, config)
    sigma, xi = posterior_mode(post.xi, post.sigma, post.weight)
    qi, mi = use_tail.nonzero(as_tuple=True)
    fit = TailFit(threshold=post.threshold, sigma=sigma, xi=xi, zeta=post.zeta, ok=post.ok)
    x = tail_hardness(ps, fit)[qi, mi]
    truth = torch.tensor(
        [
            float(
                scipy_stats.poisson(N * float(xx)).expect(
                    lambda c, jj=float(jj): jj / (jj + c) * (jj + c <= k)
                )
            )
            for xx, jj in zip(x, j[qi, mi])
        ],
        dtype=torch.float64,
    )
    g = torch.Generator().manual_seed(seed)
    plain = dataclasses.replace(config, bias_replicates=0)
    total = torch.zeros_like(truth)
    for _ in range(replicates):
        u = torch.rand(pos.shape[0], S, generator=g, dtype=torch.float64)
        scores = post.threshold.unsqueeze(1) + gpd_excess_quantile(
            u / post.zeta.unsqueeze(1), sigma.unsqueeze(1), xi.unsqueeze(1)
        )
        top = scores.topk(200, dim=1).values
        c, _ = sample_counts(ps, use_tail, top)
        p = gpd_posterior(top, S, None, config)
        terms, _ = tail_precision_terms(ps, use_tail, j, c, p, S, N, k, plain)
        total += terms[qi, mi]
    return (total / replicates - truth), (ps, valid, j, use_tail, post)


def test_bootstrap_bias_matches_a_naive_monte_carlo_of_the_estimator():
    Q, S, N, k = 40, 20_000, 400_000, 200
    g = torch.Generator().manual_seed(1)
    draw = lambda u: (u**0.2 - 1.0) / -0.2  # noqa: E731  GPD ξ = −0.2
    top_obs = draw(torch.rand(Q, S, generator=g, dtype=torch.float64)).topk(200, dim=1).values
    depth = torch.empty(Q, 3, dtype=torch.float64).uniform_(7.0, 13.0, generator=g)
    pos = draw(torch.exp(-depth))
    config = dataclasses.replace(BayesTailConfig(), bias_replicates=120, bias_seed=3)
    reference, (ps, valid, j, use_tail, post) = _naive_bias(
        pos, top_obs, S, N, k, config, replicates=120, seed=5
    )
    bias = bootstrap_bias(ps, valid, j, use_tail, post, S, N, k, config)
    assert use_tail.sum() > 60
    # The estimator is measurably biased here, and the fast simulation measures it.
    assert abs(float(reference.mean())) > 0.01
    assert abs(float(bias.mean()) - float(reference.mean())) < 0.006
    # Per positive, the two Monte Carlos agree up to their noise.
    assert float(torch.corrcoef(torch.stack([bias, reference]))[0, 1]) > 0.9


def test_poisson_precision_terms_of_the_simulated_truth_match_scipy():
    N = 1_000_000
    j = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    mean = torch.tensor([[4.0, 50.0]], dtype=torch.float64)
    valid = torch.ones(1, 2, dtype=torch.bool)
    got = expected_precision_terms(j, valid, mean / N, N, 60, law="poisson")
    for i in range(2):
        ref = scipy_stats.poisson(float(mean[0, i])).expect(
            lambda c, jj=float(j[0, i]): jj / (jj + c) * (jj + c <= 60)
        )
        assert float(got[0, i]) == pytest.approx(ref, abs=1e-6)


def test_degenerate_tails_take_no_part_in_the_simulated_worlds(monkeypatch):
    """A query without a usable tail is counted only: it gets no simulated sample,
    so its stand-in tail cannot enter the bootstrap's empirical-Bayes prior."""
    import rl_gap.metrics.tail.posterior_predictive as predictive
    from rl_gap.metrics.tail import predict_map

    g = torch.Generator().manual_seed(0)
    sample = torch.randn(6, 4000, generator=g, dtype=torch.float64)
    sample[0] = 0.5  # every sampled score equal: no tail to fit
    pos = torch.tensor(
        [[0.7, 4.0], [2.5, 3.0], [3.5, 4.5], [3.9, 3.0], [2.0, 4.2], [4.4, 3.1]],
        dtype=torch.float64,
    )
    simulated = []

    def recording_posterior(top, *args, **kwargs):
        simulated.append(top.clone())
        return gpd_posterior(top, *args, **kwargs)

    monkeypatch.setattr(predictive, "gpd_posterior", recording_posterior)
    est = predict_map(pos, sample, gallery_size=80_000, k=100, estimator="tail", n_boot=10)
    assert len(simulated) == BayesTailConfig().bias_replicates
    assert all(bool(torch.isneginf(top[0]).all()) for top in simulated)
    assert all(bool(torch.isfinite(top[1:]).all()) for top in simulated)
    assert torch.isfinite(est.per_query).all() and float(est.per_query[0]) == 1.0
