"""Parametric-bootstrap bias of the ``tail`` estimator's predictive E[precision].

The predictive E[AP@k] averages a strongly non-linear function of each tail
positive's hardness over a wide posterior (extrapolating 20× past the sample
spreads log x by ~1 nat), so its expectation over the distractor sample is
not the truth even when the GPD is the right model: positives just past the
sampled maximum come out too easy (posterior mass on endpoints below them),
positives near a bounded endpoint too hard (mass on endpoints beyond them).
The size and sign depend on where each positive sits, so no constant fixes it.

The classical remedy is a bootstrap bias correction: simulate distractor
samples from the fitted tail (the posterior-mode GPD above the threshold,
with the fitted exceedance rate), run the estimator on each, and subtract the
mean difference between its predictions and the truth *of the simulated
world* (E[precision] under Poisson(N·x̂) at the fitted hardness x̂). Only tail
positives (those the sample reaches fewer than ``min_count`` times) are
corrected; counted positives are unbiased already. Measurements:
``docs/tail_extrapolation.md``.
"""

from __future__ import annotations

import torch


def posterior_mode(
    xi: torch.Tensor, sigma: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(σ, ξ) per query at the grid point of largest posterior weight.

    Args:
        xi: (G,) shape grid; sigma: (Q, G) profile scales; weight: (Q, G).
    """
    best = weight.argmax(1, keepdim=True)
    return sigma.gather(1, best).squeeze(1), xi[best.squeeze(1)]


def gpd_excess_quantile(
    tail_prob: torch.Tensor, sigma: torch.Tensor, xi: torch.Tensor
) -> torch.Tensor:
    """Excess y with GPD survival ``tail_prob`` (> 1 gives y < 0: the fitted tail continued below u)."""
    return sigma / xi * torch.expm1(-xi * torch.log(tail_prob))


def smallest_uniforms(
    n_rows: int, n_draws: int, width: int, generator: torch.Generator
) -> torch.Tensor:
    """(n_rows, width) the ``width`` smallest of ``n_draws`` i.i.d. U(0, 1) per row, ascending.

    Exact through exponential spacings: U_(i) = G_i / G_(n+1) with G the
    partial sums of n + 1 standard exponentials (the tail of the sum is one
    Gamma(n + 1 − width) draw).
    """
    gaps = torch.empty(n_rows, width, dtype=torch.float64).exponential_(generator=generator)
    partial = gaps.cumsum(1)
    rest = torch._standard_gamma(
        torch.full((n_rows, 1), float(n_draws + 1 - width), dtype=torch.float64),
        generator=generator,
    )
    return partial / (partial[:, -1:] + rest)


def simulate_top_scores(
    threshold: torch.Tensor,
    zeta: torch.Tensor,
    sigma: torch.Tensor,
    xi: torch.Tensor,
    n_sample: int,
    width: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """(Q, width) the top scores of a simulated sample of ``n_sample``, descending.

    A score exceeds ``threshold + y`` with probability ``zeta·S_GPD(y; σ, ξ)``.
    """
    p = smallest_uniforms(threshold.shape[0], n_sample, width, generator)
    y = gpd_excess_quantile(p / zeta.unsqueeze(1), sigma.unsqueeze(1), xi.unsqueeze(1))
    return threshold.unsqueeze(1) + y
