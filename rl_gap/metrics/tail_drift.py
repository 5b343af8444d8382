"""Penultimate shape drift: the GPD shape of a sampled tail as a function of depth.

A GPD fitted above a finite threshold has the *local* (penultimate) shape of
the tail near that threshold, not the shape at the depth of the positives it
extrapolates to. For light or bounded tails that are not exactly GPD the local
shape changes slowly with depth ``L = −log P(score > s)``; for a Weibull-type
tail ``P(Y > y) = exp(−(y/λ)^β)`` it is exactly ``ξ(L) = (1 − β)/(β·L)``
(the reciprocal hazard is ``r(y) = λ^β·y^(1−β)/β`` and ``ξ = dr/dy``). The
``tail`` estimator therefore models the shape as

    ξ(L) = ξ_c + c·(1/L − 1/L_c),

with ξ_c the shape fitted at the threshold (whose excesses sit at mean depth
L_c), and one drift coefficient c shared by all queries, estimated from a
ladder of thresholds in the sample (:func:`fit_shape_drift`). The survival of
an excess then follows from the reciprocal hazard ``r = dy/dL`` with
``dr/dL = r·ξ(L)`` (:func:`drift_survival`); c = 0 is exactly the GPD.
Measurements: ``docs/tail_extrapolation.md``.
"""

from __future__ import annotations

import math

import torch


def threshold_depths(n_sample: int, n_excess: int) -> tuple[float, float]:
    """Depths of a threshold with ``n_excess`` of ``n_sample`` scores above it.

    Returns:
        L_u = log(S / n_u), the depth of the threshold itself, and
        L_c = mean over i = 1..n_u of log(S / i), the mean depth of its excesses.
    """
    if not 0 < n_excess < n_sample:
        raise ValueError(f"need 0 < n_excess < n_sample, got {n_excess} and {n_sample}")
    i = torch.arange(1, n_excess + 1, dtype=torch.float64)
    return math.log(n_sample / n_excess), float(torch.log(n_sample / i).mean())


def fit_shape_drift(shapes: torch.Tensor, depths: torch.Tensor) -> float:
    """Least-squares c of ``ξ = a + c/L`` through a ladder of (depth, shape) points.

    Args:
        shapes: (n,) tail shapes fitted at thresholds of increasing exceedance counts.
        depths: (n,) the mean depth L_c of each threshold's excesses.

    Returns:
        c (0.0 with fewer than 3 finite points: a drift needs a trend and a check of it).
    """
    shapes = shapes.to(torch.float64)
    depths = depths.to(torch.float64)
    keep = torch.isfinite(shapes) & torch.isfinite(depths) & (depths > 0)
    if int(keep.sum()) < 3:
        return 0.0
    x = 1.0 / depths[keep]
    y = shapes[keep]
    xc = x - x.mean()
    return float((xc * (y - y.mean())).sum() / (xc * xc).sum().clamp_min(1e-300))


def drift_depth_grid(n_grid: int = 600, span: float = 60.0) -> torch.Tensor:
    """Depths below the threshold, ΔL ∈ [0, span], dense near 0 (where most positives sit)."""
    return torch.cat(
        [
            torch.zeros(1, dtype=torch.float64),
            torch.logspace(-4, math.log10(span), n_grid - 1, dtype=torch.float64),
        ]
    )


def _log_reciprocal_hazard(
    xi: torch.Tensor, drift: float, depth_u: float, depth_c: float, delta: torch.Tensor
) -> torch.Tensor:
    """(G, n) log(r/σ) at depth ``depth_u + delta``: ∫ ξ(l) dl from L_u, in closed form."""
    L = depth_u + delta
    return (xi.unsqueeze(1) - drift / depth_c) * delta.unsqueeze(0) + drift * torch.log(
        L / depth_u
    ).unsqueeze(0)


def _segment_rate(log_r: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Slope a of log r on each grid segment (r is exponential in L within a segment)."""
    return (log_r[..., 1:] - log_r[..., :-1]) / (delta[1:] - delta[:-1])


def _exp_integral(a: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """∫_0^h e^(a·l) dl = expm1(a·h)/a, → h as a → 0."""
    small = (a * h).abs() < 1e-8
    safe = torch.where(small, torch.ones_like(a), a)
    return torch.where(small, h * (1.0 + 0.5 * a * h), torch.expm1(a * h) / safe)


def scaled_excess_at_depth(
    xi: torch.Tensor, drift: float, depth_u: float, depth_c: float, delta: torch.Tensor
) -> torch.Tensor:
    """(G, n) excess / σ reached at depth ``depth_u + delta`` for each threshold shape.

    ``y = ∫ r dL`` with ``r/σ = exp(∫ ξ(l) dl)``; log r is integrated in closed form
    and taken linear between grid depths, so each segment's integral is exact for
    an exponential — exactly the GPD when drift = 0.
    """
    log_r = _log_reciprocal_hazard(xi, drift, depth_u, depth_c, delta)
    h = (delta[1:] - delta[:-1]).unsqueeze(0)
    seg = torch.exp(log_r[:, :-1]) * _exp_integral(_segment_rate(log_r, delta), h)
    return torch.cat([torch.zeros_like(log_r[:, :1]), torch.cumsum(seg, 1)], 1)


def drift_survival(
    y: torch.Tensor,
    sigma: torch.Tensor,
    xi: torch.Tensor,
    drift: float,
    depth_u: float,
    depth_c: float,
    delta: torch.Tensor | None = None,
) -> torch.Tensor:
    """P(Y > y | Y > 0) of an excess under the drifting shape (GPD when drift = 0).

    Args:
        y: (P,) excesses over the threshold (≥ 0).
        sigma: (P, G) scale at the threshold (the reciprocal hazard there).
        xi: (G,) shape ξ_c at the threshold's mean excess depth.
        drift: c of ``ξ(L) = ξ_c + c·(1/L − 1/L_c)``.
        depth_u, depth_c: L_u and L_c of :func:`threshold_depths`.
        delta: depth grid below the threshold (default :func:`drift_depth_grid`).

    Returns:
        (P, G) float64; 0 beyond the endpoint (or beyond the grid's depth span).
    """
    delta = drift_depth_grid() if delta is None else delta.to(torch.float64)
    xi = xi.to(torch.float64)
    log_r = _log_reciprocal_hazard(xi, float(drift), depth_u, depth_c, delta)
    grid = scaled_excess_at_depth(xi, float(drift), depth_u, depth_c, delta)  # (G, n)
    rate = _segment_rate(log_r, delta)  # (G, n − 1)
    z = y.to(torch.float64).unsqueeze(1) / sigma.to(torch.float64)  # (P, G)
    out = torch.zeros_like(z)
    n = delta.numel()
    for g in range(xi.numel()):
        col = z[:, g].contiguous()
        seg = (torch.searchsorted(grid[g].contiguous(), col) - 1).clamp(0, n - 2)
        a = rate[g][seg]
        # Invert y = y_0 + r_0·expm1(a·l)/a inside the segment for the depth l.
        rest = (col - grid[g][seg]).clamp_min(0.0) / torch.exp(log_r[g][seg])
        small = (a * rest).abs() < 1e-8
        safe = torch.where(small, torch.ones_like(a), a)
        arg = (a * rest).clamp_min(-1.0 + 1e-16)
        within = torch.where(small, rest * (1.0 - 0.5 * a * rest), torch.log1p(arg) / safe)
        depth = delta[seg] + within.clamp(min=0.0)
        beyond = col >= grid[g][-1]
        out[:, g] = torch.where(beyond, torch.zeros_like(depth), torch.exp(-depth))
    return out
