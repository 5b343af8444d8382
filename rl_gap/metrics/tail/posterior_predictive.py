"""The ``tail`` estimator's prediction: predictive E[AP@k], bias-corrected.

Given the per-query GPD posterior (``bayes.gpd_posterior``), each
positive's realized pool count is ``K_N = K_S + K'``:

- counted positives (``K_S ≥ min_count``): ``x | K_S ~ Gamma(K_S, S)``, so
  ``K'`` is negative binomial with r = K_S and mean ``(N − S)·K_S/S``;
- tail positives: ``x(ξ) = ζ·P(Y > s_j − u | θ)`` on the posterior grid and
  ``ζ ~ Gamma(n_u, S)``, so ``K' | θ`` is negative binomial with r = n_u.

``E[AP@k] = (1/min(k, m)) Σ_j E[ j/(j + K_N) · 1{j + K_N ≤ k} ]``, exact by
linearity. The tail positives' terms are then corrected by a parametric
bootstrap of the whole estimator (``bias``).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from rl_gap.metrics.tail.bayes import (
    DEFAULT_BAYES,
    BayesTailConfig,
    GPDPosterior,
    gpd_posterior,
    shape_integrated_survival,
)
from rl_gap.metrics.tail.bias import posterior_mode, simulate_top_scores
from rl_gap.metrics.tail.gpd import gpd_survival
from rl_gap.metrics.tail.hardness import TailFit, sample_counts, tail_hardness
from rl_gap.metrics.tail.rank_law import (
    expected_precision,
    expected_precision_terms,
)


def tail_survival(
    pos_sorted: torch.Tensor, valid: torch.Tensor, post: GPDPosterior, config: BayesTailConfig
) -> torch.Tensor:
    """(Q, m, G) P(Y > s_j − u) of each positive on each posterior grid point (1 below u).

    Times the exceedance rate ζ it is the positive's hardness under that grid point.
    """
    Q = pos_sorted.shape[0]
    s = torch.where(
        valid, pos_sorted.to(torch.float64), torch.zeros_like(pos_sorted, dtype=torch.float64)
    )
    y = (s - post.threshold.unsqueeze(1)).clamp_min(0.0)
    G = post.xi.numel()
    sigma = torch.where(post.ok.unsqueeze(1), post.sigma, torch.ones_like(post.sigma))
    if config.integrate_shape:
        # In query chunks: the quadrature holds (rows, m, G, nodes) values.
        return torch.cat(
            [
                shape_integrated_survival(
                    y[r : r + 128].unsqueeze(-1),
                    sigma[r : r + 128].unsqueeze(1),
                    post.xi.view(1, 1, G),
                    post.n_u[r : r + 128].view(-1, 1, 1),
                    post.xi_min,
                    post.xi_max,
                    post.prior_mean,
                    post.prior_sd,
                )
                for r in range(0, max(Q, 1), 128)
            ]
        )
    return gpd_survival(y.unsqueeze(-1), sigma.unsqueeze(1), post.xi.view(1, 1, G))


def bootstrap_bias(
    pos_sorted: torch.Tensor,
    valid: torch.Tensor,
    j: torch.Tensor,
    use_tail: torch.Tensor,
    post: GPDPosterior,
    n_sample: int,
    gallery_size: int,
    k: int,
    config: BayesTailConfig = DEFAULT_BAYES,
) -> torch.Tensor:
    """(P,) bootstrap bias of the predicted E[precision] of the ``use_tail`` positives.

    Simulates ``config.bias_replicates`` samples from each query's posterior-mode
    GPD tail (``bias``), re-runs the whole estimator (threshold, posterior,
    empirical-Bayes prior, predictive) on them, and returns the mean prediction
    minus the simulated world's truth, in ``use_tail.nonzero()`` order.
    """
    sigma, xi = posterior_mode(post.xi, post.sigma, post.weight)
    width = max(2, min(config.n_excess, n_sample - 1) + 2)
    qi, mi = use_tail.nonzero(as_tuple=True)
    # Tail positives lie above u (fewer than min_count sampled scores beat them) on ok rows.
    fit = TailFit(threshold=post.threshold, sigma=sigma, xi=xi, zeta=post.zeta, ok=post.ok)
    x_fit = tail_hardness(pos_sorted, fit)
    truth = expected_precision_terms(j, use_tail, x_fit, gallery_size, k, law="poisson")[qi, mi]
    gen = torch.Generator().manual_seed(config.bias_seed)
    plain = dataclasses.replace(config, bias_replicates=0)  # the uncorrected predictive terms
    total = torch.zeros_like(truth)
    for _ in range(config.bias_replicates):
        sim = simulate_top_scores(post.threshold, post.zeta, sigma, xi, n_sample, width, gen)
        # Degenerate tails (counted only) get no simulated sample, so they stay out of the prior.
        sim = torch.where(post.ok.unsqueeze(1), sim, torch.full_like(sim, -math.inf))
        sim_counts, _ = sample_counts(pos_sorted, use_tail, sim)
        sim_post = gpd_posterior(sim, n_sample, None, config)
        terms, _ = tail_precision_terms(
            pos_sorted, use_tail, j, sim_counts, sim_post, n_sample, gallery_size, k, plain
        )
        total += terms[qi, mi]
    return total / config.bias_replicates - truth


def tail_positives(
    valid: torch.Tensor, counts: torch.Tensor, post: GPDPosterior, config: BayesTailConfig
) -> torch.Tensor:
    """(Q, m) the positives predicted from the GPD tail: fewer than ``config.min_count``
    sampled scores beat them, on a query whose tail fit is ok (the others are counted)."""
    return valid & (counts < config.min_count) & post.ok.unsqueeze(1)


def tail_precision_terms(
    pos_sorted: torch.Tensor,
    valid: torch.Tensor,
    j: torch.Tensor,
    counts: torch.Tensor,
    post: GPDPosterior,
    n_sample: int,
    gallery_size: int,
    k: int,
    config: BayesTailConfig = DEFAULT_BAYES,
    survival: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-positive predictive E[precision] at gallery size N (the ``tail`` estimator).

    With ``config.bias_replicates > 0`` the tail positives' (:func:`tail_positives`)
    terms are bias-corrected (:func:`bootstrap_bias`) and clipped to [0, 1].

    Args:
        pos_sorted, valid, j: from ``rank_law.sort_positives``, (Q, m).
        counts: (Q, m) sampled distractors ≥ each positive (K_S).
        post: the per-query GPD posterior.
        n_sample: S; gallery_size: N (≥ S); k: cut-off.
        config: the ``tail`` settings.
        survival: :func:`tail_survival` of these positives under ``post`` (None: computed
            here); it does not depend on N, so a curve over N computes it once.

    Returns:
        terms: (Q, m) float64 (0 at padding);
        hardness: (Q, m) posterior-mean hardness E[x] (0 at padding).
    """
    Q, m = pos_sorted.shape
    extra = float(gallery_size - n_sample)
    surv = tail_survival(pos_sorted, valid, post, config) if survival is None else survival
    x_tail = post.zeta.view(Q, 1, 1) * surv  # (Q, m, G)
    use_tail = tail_positives(valid, counts, post, config)
    counted = valid & ~use_tail
    terms = torch.zeros(Q, m, dtype=torch.float64)
    hardness = torch.zeros(Q, m, dtype=torch.float64)
    if bool(use_tail.any()):
        qi, mi = use_tail.nonzero(as_tuple=True)
        mix = post.weight[qi]
        mean = extra * x_tail[qi, mi]
        r = post.n_u[qi].clamp_min(1.0)
        terms[qi, mi] = expected_precision(j[qi, mi], counts[qi, mi], r, mean, mix, k)
        hardness[qi, mi] = (mix * x_tail[qi, mi]).sum(1)
    if bool(counted.any()):
        qi, mi = counted.nonzero(as_tuple=True)
        c = counts[qi, mi].to(torch.float64)
        # x | K_S ~ Gamma(K_S, S): K' negative binomial, r = K_S, mean (N − S)·K_S/S.
        mean = (extra * c / n_sample).unsqueeze(1)
        r = c.clamp_min(1e-3)
        mean = torch.where(c.unsqueeze(1) > 0, mean, torch.zeros_like(mean))
        ones = torch.ones_like(mean)
        terms[qi, mi] = expected_precision(j[qi, mi], c, r, mean, ones, k)
        hardness[qi, mi] = c / n_sample
    if config.bias_replicates > 0 and gallery_size > n_sample and bool(use_tail.any()):
        bias = bootstrap_bias(
            pos_sorted, valid, j, use_tail, post, n_sample, gallery_size, k, config
        )
        qi, mi = use_tail.nonzero(as_tuple=True)
        terms[qi, mi] = (terms[qi, mi] - bias).clamp(0.0, 1.0)
    return terms, hardness
