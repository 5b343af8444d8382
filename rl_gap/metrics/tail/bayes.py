"""The ``tail`` estimator's posterior: GPD parameter uncertainty per query.

The ``evt`` estimator (``hardness``) plugs the maximum-likelihood GPD
into the hardness of each unseen positive. Two of its errors are systematic:

1. Beyond the fitted endpoint ``u − σ/ξ`` the plug-in hardness is exactly 0
   (the positive is called immune), although the endpoint itself is uncertain
   (a ξ̂ a little too negative moves it below positives the pool does reach).
2. ``prec = j / (j + N·x̂)`` is convex in x̂, so plugging in a noisy x̂
   is biased, and the realized rank is random besides.

``tail`` predicts each positive's realized pool count instead of its expected
rank. For a query with S sampled distractors, positive j (K_S of them scoring
≥ s_j) of a pool of N that contains the sample, the pool count is
``K_N = K_S + K'`` with ``K' | x ~ Poisson((N − S)·x)``:

- counted positives (``K_S ≥ min_count``): ``x | K_S ~ Gamma(K_S, S)`` (the
  scale-free prior 1/x), so ``K'`` is negative binomial with r = K_S and mean
  ``(N − S)·K_S/S``;
- tail positives: ``x(ξ) = ζ·S_GPD(s_j − u; σ̂(ξ), ξ)``, integrated over a
  posterior along the profile likelihood in θ = ξ/σ (θ = −1/endpoint; for
  each θ the shape is ξ̂(θ), as in ``gpd``), on a grid uniform in ξ̂(θ)
  over [xi_min, xi_max] with a prior on that shape, and over the exceedance rate
  ``ζ ~ Gamma(n_u, S)`` (so ``K' | ξ`` is negative binomial with r = n_u).
  Posterior mass on larger endpoints gives positives beyond the fitted
  endpoint a small but non-zero hardness. At each θ the exceedance
  probability is also averaged over the shape (:func:`shape_integrated_survival`).

Then ``E[AP@k] = (1/min(k, m)) Σ_j E[ j/(j + K_N) · 1{j + K_N ≤ k} ]``, exact
by linearity, with the tail positives' terms bias-corrected by a parametric
bootstrap (``predictive``, ``bias``). The threshold u is the
(n_u + 1)-th largest sampled score, n_u = ``n_excess``; see
``docs/tail_extrapolation.md`` for the measurements behind these choices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rl_gap.metrics.tail.gpd import (
    capped_excesses,
    largest_excess,
    profile_on_xi_grid,
    with_stand_in,
)
from rl_gap.metrics.tail.hardness import threshold_excesses


@dataclass(frozen=True)
class BayesTailConfig:
    """Settings of the ``tail`` estimator.

    Attributes:
        n_excess: exceedances over the threshold (u = the (n_excess + 1)-th
            largest sampled score of the query).
        xi_min, xi_max: support of the flat prior on the GPD shape ξ.
        n_xi: ξ grid points of the posterior.
        min_count: positives reached by at least this many sampled
            distractors are counted, the others use the tail.
        min_excesses: fewer exceedances (e.g. a tiny sample) → count only.
        prior: "empirical" (a normal prior on ξ, truncated to the support,
            whose mean and spread maximise the marginal likelihood of all
            queries' tails: queries borrow strength from each other) or
            "flat" (uniform on [xi_min, xi_max]).
        integrate_shape: at each θ, integrate the exceedance probability over
            the shape ξ over its support under the prior (:func:`shape_integrated_survival`)
            instead of plugging in ξ̂(θ).
        bias_replicates: simulated samples from the fitted tail for the
            bootstrap bias correction of the tail positives (``bias``);
            0 turns the correction off.
        bias_seed: seed of those simulations (the prediction is deterministic).
    """

    n_excess: int = 100
    xi_min: float = -1.0
    xi_max: float = 0.5
    n_xi: int = 61
    min_count: int = 5
    min_excesses: int = 10
    prior: str = "empirical"
    integrate_shape: bool = True
    bias_replicates: int = 8
    bias_seed: int = 0


DEFAULT_BAYES = BayesTailConfig()


@dataclass
class GPDPosterior:
    """Per-query posterior over the GPD shape on a ξ grid.

    Attributes:
        threshold: (Q,) u.
        xi: (G,) grid of ξ.
        sigma: (Q, G) profile-likelihood scale σ̂(ξ).
        weight: (Q, G) posterior weights (rows sum to 1).
        n_u: (Q,) (weighted) exceedances; zeta: (Q,) n_u / S.
        ok: (Q,) False where the tail is degenerate (the estimator counts).
        xi_min, xi_max: the shape's support; prior_mean, prior_sd: the normal
            prior on ξ (None: flat), which the shape integration also uses.
    """

    threshold: torch.Tensor
    xi: torch.Tensor
    sigma: torch.Tensor
    weight: torch.Tensor
    n_u: torch.Tensor
    zeta: torch.Tensor
    ok: torch.Tensor
    xi_min: float = -1.0
    xi_max: float = 0.5
    prior_mean: float | None = None
    prior_sd: float | None = None

    @property
    def xi_mean(self) -> torch.Tensor:
        """(Q,) posterior mean of ξ."""
        return (self.weight * self.xi).sum(1)


def empirical_log_prior(logw: torch.Tensor, ok: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:
    """Log of the normal prior on ξ (on the grid) maximising the marginal likelihood."""
    return empirical_prior(logw, ok, xi)[0]


def empirical_prior(
    logw: torch.Tensor, ok: torch.Tensor, xi: torch.Tensor
) -> tuple[torch.Tensor, float | None, float | None]:
    """The normal prior on ξ maximising the marginal likelihood: (log weights, mean, sd).

    Args:
        logw: (Q, G) log-likelihood on the ξ grid (any per-row constant).
        ok: (Q,) rows that take part.
        xi: (G,) grid.

    Returns:
        (G,) log prior weights (normalised on the grid), the prior's mean and sd;
        flat (mean and sd None) when no row is ok.
    """
    if not bool(ok.any()):
        return torch.full_like(xi, -math.log(xi.numel())), None, None
    like = torch.exp(logw[ok] - logw[ok].amax(1, keepdim=True))  # (q, G)
    lo, hi = float(xi.min()), float(xi.max())
    means = torch.linspace(lo, hi, 4 * xi.numel(), dtype=torch.float64)
    sds = torch.logspace(math.log10(0.01), math.log10(hi - lo), 24, dtype=torch.float64)
    z = (xi.view(1, 1, -1) - means.view(-1, 1, 1)) / sds.view(1, -1, 1)
    prior = torch.exp(-0.5 * z**2)
    prior = prior / prior.sum(-1, keepdim=True)  # (M, D, G)
    marginal = torch.einsum("qg,mdg->mdq", like, prior).clamp_min(1e-300)
    score = torch.log(marginal).sum(-1)  # (M, D)
    best = int(score.argmax())
    log_prior = torch.log(prior.reshape(-1, xi.numel())[best].clamp_min(1e-300))
    return log_prior, float(means[best // sds.numel()]), float(sds[best % sds.numel()])


def shape_integrated_survival(
    y: torch.Tensor,
    sigma: torch.Tensor,
    xi: torch.Tensor,
    n: torch.Tensor,
    xi_min: float = -1.0,
    xi_max: float = 0.5,
    prior_mean: float | None = None,
    prior_sd: float | None = None,
    nodes: int = 64,
) -> torch.Tensor:
    """Exceedance probability at excess y for fixed θ = ξ̂/σ, averaged over the shape.

    For fixed θ (σ = ξ/θ, so ξ has the sign of θ) the GPD likelihood of n
    excesses is ``∝ |ξ|^(−n)·exp(−n·ξ̂/ξ)`` with ξ̂ = ξ̂(θ). The shape is
    averaged over the support ``[xi_min, xi_max]`` only, under the estimator's
    prior on ξ (flat, or normal with ``prior_mean``/``prior_sd``, truncated to
    the support): ``P(Y > y) = (1 + θy)^(−1/ξ) = exp(−|c|·v)`` with
    ``c = log1p(θy)`` and ``v = 1/|ξ|``. In ``w = log v`` the likelihood is
    ``exp((n − 1)·w − n·|ξ̂|·e^w)`` (a flat prior on ξ makes v Gamma(n − 1, n|ξ̂|)),
    integrated by the midpoint rule on ``nodes`` points over ±10 standard
    deviations of that law around its mode, clipped to the support. Zero
    beyond the endpoint −1/θ. Slightly heavier than the plug-in
    ``(1 + θy)^(−1/ξ̂)``, more so deep in the tail.

    Args:
        y: (Q, m, 1) excesses ≥ 0; sigma: (Q, 1, G) σ̂(θ) > 0; xi: (1, 1, G)
            ξ̂(θ) ≠ 0 inside [xi_min, xi_max]; n: (Q, 1, 1) (weighted) number of
            excesses ≥ 2. Other shapes broadcasting to (Q, m, G) work too.
        xi_min, xi_max: the shape's support (xi_min < 0 < xi_max).
        prior_mean, prior_sd: the normal prior on ξ (None: flat).
        nodes: quadrature points.

    Returns:
        (Q, m, G) float64.
    """
    y, sigma, xi, n = (t.to(torch.float64) for t in (y, sigma, xi, n))
    theta = xi / sigma
    inside = 1.0 + theta * y
    c = torch.log(inside.clamp_min(1e-300)).abs()  # (Q, m, G)
    n = n.clamp_min(2.0)
    a_xi = xi.abs().clamp_min(1e-12)
    mode = torch.log((n - 1.0) / (n * a_xi))  # (Q, 1, G): mode of w = log(1/|ξ|)
    sd = 1.0 / torch.sqrt(n - 1.0)
    # v ≥ 1/|bound| on the side of ξ's sign (|ξ| ≤ the bound).
    bound = torch.where(xi < 0, torch.full_like(xi, -xi_min), torch.full_like(xi, xi_max))
    w_lo = torch.maximum(mode - 10.0 * sd, -torch.log(bound))
    w_hi = torch.maximum(mode + 10.0 * sd, w_lo + 1e-9)
    frac = (torch.arange(nodes, dtype=torch.float64) + 0.5) / nodes
    w = w_lo.unsqueeze(-1) + (w_hi - w_lo).unsqueeze(-1) * frac  # (Q, 1, G, H)
    v = torch.exp(w)
    logf = (n - 1.0).unsqueeze(-1) * w - (n * a_xi).unsqueeze(-1) * v
    if prior_mean is not None and prior_sd is not None:
        shape = torch.where(xi.unsqueeze(-1) < 0, -1.0 / v, 1.0 / v)
        logf = logf - 0.5 * ((shape - prior_mean) / prior_sd) ** 2
    mass = torch.softmax(logf, dim=-1)  # the midpoint rule's equal widths cancel
    out = (mass * torch.exp(-c.unsqueeze(-1) * v)).sum(-1)
    return torch.where(inside > 0, out, torch.zeros_like(out))


def gpd_posterior(
    top: torch.Tensor,
    n_sample: int,
    weight: torch.Tensor | None = None,
    config: BayesTailConfig = DEFAULT_BAYES,
) -> GPDPosterior:
    """Threshold, exceedance rate and ξ posterior of every query's sampled tail: the
    arguments of :func:`~rl_gap.metrics.tail.hardness.fit_tail`, ``config`` the ``tail``
    settings (``n_excess`` exceedances, the ξ grid and prior)."""
    top = top.to(torch.float64)
    n_exc = capped_excesses(config.n_excess, n_sample, top.shape[1])
    u, has_u, excess, w_exc = threshold_excesses(top, n_exc, weight)
    n_u = w_exc.sum(1)
    ok = has_u & (n_u >= config.min_excesses) & (largest_excess(excess, w_exc) > 0)
    # Degenerate rows get a harmless stand-in so the vectorised maths stays finite.
    excess, w_exc_safe = with_stand_in(excess, w_exc, ok)
    # Midpoint grid: never exactly ξ = 0 (θ = 0 is the exponential limit).
    edges = torch.linspace(config.xi_min, config.xi_max, config.n_xi + 1, dtype=torch.float64)
    xi = 0.5 * (edges[1:] + edges[:-1])
    xi = torch.where(xi.abs() < 1e-9, torch.full_like(xi, 1e-9), xi)
    sigma, loglik = profile_on_xi_grid(excess, w_exc_safe, xi)
    logw = loglik - loglik.amax(1, keepdim=True)
    prior_mean = prior_sd = None
    if config.prior == "empirical":
        log_prior, prior_mean, prior_sd = empirical_prior(logw, ok, xi)
        logw = logw + log_prior.unsqueeze(0)
    elif config.prior != "flat":
        raise ValueError(f"unknown prior {config.prior!r}; known: empirical, flat")
    post = torch.exp(logw - logw.amax(1, keepdim=True))
    post = post / post.sum(1, keepdim=True)
    return GPDPosterior(
        threshold=u,
        xi=xi,
        sigma=sigma,
        weight=post,
        n_u=n_u,
        zeta=n_u / float(n_sample),
        ok=ok,
        xi_min=config.xi_min,
        xi_max=config.xi_max,
        prior_mean=prior_mean,
        prior_sd=prior_sd,
    )
