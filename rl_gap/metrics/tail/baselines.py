"""Baselines of *Web Scale on a Budget* that extrapolate the mAP curve, not hardness.

- ``powerlaw``: fit ``mAP(n) = a·n^b`` (least squares of log mAP on log n)
  to the metric measured on nested sub-samples of the sample (S/8, S/4, S/2,
  S) and evaluate it at N.
- ``loguniform``: fit ``mAP(n) = a + b·log n`` (the decay that log-uniform
  hardness implies) to the same points; clipped to [0, 1].
- ``single_x``: the homogeneous model of the paper's Fig. 2: one hardness x
  shared by every positive of every query, calibrated so that the plug-in
  map reproduces the mAP measured on the sample at n = S, then evaluated at N.
  The map depends on n and x only through λ = n·x, so calibration is one
  monotone 1-D inversion and the prediction is the map at λ·N/S.

Intervals: the same query bootstrap as the hardness estimators (queries
resampled, every fit redone per replicate).
"""

from __future__ import annotations

import math

import torch

from rl_gap.metrics.tail.rank_law import ap_at_k_from_counts

CURVE_ESTIMATORS = ("powerlaw", "loguniform")


def fit_curve(sizes: torch.Tensor, maps: torch.Tensor, kind: str, target: float) -> torch.Tensor:
    """Fit mAP against gallery size and evaluate at ``target``, per row.

    Args:
        sizes: (L,) gallery sizes (> 0) of the measured points.
        maps: (B, L) measured mAP per row (e.g. bootstrap replicates).
        kind: "powerlaw" (log mAP linear in log n) or "loguniform" (mAP linear in log n).
        target: N.

    Returns:
        (B,) float64 predictions in [0, 1].
    """
    if kind not in CURVE_ESTIMATORS:
        raise ValueError(f"unknown curve fit {kind!r}; known: {', '.join(CURVE_ESTIMATORS)}")
    if sizes.numel() < 2:
        raise ValueError("a curve fit needs at least two nested sub-sample sizes")
    t = torch.log(sizes.to(torch.float64))
    y = maps.to(torch.float64)
    if kind == "powerlaw":
        y = torch.log(y.clamp_min(1e-12))
    tc = t - t.mean()
    slope = (y - y.mean(1, keepdim=True)) @ tc / (tc * tc).sum()
    at = y.mean(1) + slope * (math.log(target) - float(t.mean()))
    out = torch.exp(at) if kind == "powerlaw" else at
    return out.clamp(0.0, 1.0)


def _lambda_grid(k: int) -> torch.Tensor:
    # λ = n·x: 0 and log-spaced up to far past the cut-off (every AP is 0 there).
    return torch.cat(
        [torch.zeros(1, dtype=torch.float64), torch.logspace(-6, math.log10(4.0 * k), 1200)]
    )


def single_x_curves(
    j: torch.Tensor, valid: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-query AP@k when every positive has the same hardness, on a λ = n·x grid.

    Returns:
        lam: (G,) grid; ap: (Q, G) AP@k at rank j + λ (NaN rows without positives).
    """
    lam = _lambda_grid(k)
    Q, m = j.shape
    counts = lam.view(1, -1, 1).expand(Q, -1, m)
    ap = ap_at_k_from_counts(
        j.unsqueeze(1).expand(-1, lam.numel(), -1).reshape(-1, m),
        valid.unsqueeze(1).expand(-1, lam.numel(), -1).reshape(-1, m),
        counts.reshape(-1, m),
        k,
    ).view(Q, lam.numel())
    return lam, ap


def invert_decreasing(lam: torch.Tensor, curve: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """λ at which each row's non-increasing ``curve`` (B, G) crosses ``target`` (B,).

    Linear interpolation between grid points; the ends of the grid clamp.
    """
    below = (curve > target.unsqueeze(1)).sum(1)  # points still above the target
    i = below.clamp(1, lam.numel() - 1)
    c0 = curve.gather(1, (i - 1).unsqueeze(1)).squeeze(1)
    c1 = curve.gather(1, i.unsqueeze(1)).squeeze(1)
    w = ((c0 - target) / (c0 - c1).clamp_min(1e-300)).clamp(0.0, 1.0)
    return lam[i - 1] + w * (lam[i] - lam[i - 1])


def interpolate(lam: torch.Tensor, curve: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """Rows of ``curve`` (B, G) on grid ``lam`` evaluated at ``at`` (B,) (clamped to the grid)."""
    at = at.clamp(float(lam[0]), float(lam[-1]))
    i = torch.searchsorted(lam, at.contiguous()).clamp(1, lam.numel() - 1)
    l0, l1 = lam[i - 1], lam[i]
    w = ((at - l0) / (l1 - l0)).clamp(0.0, 1.0)
    c0 = curve.gather(1, (i - 1).unsqueeze(1)).squeeze(1)
    c1 = curve.gather(1, i.unsqueeze(1)).squeeze(1)
    return c0 + w * (c1 - c0)


def single_x_predict(
    lam: torch.Tensor, ap_grid: torch.Tensor, measured: torch.Tensor, ratio: float
) -> torch.Tensor:
    """Calibrate λ_S per row so the mean AP curve hits ``measured``, return the curve at λ_S·ratio.

    Args:
        lam: (G,) grid; ap_grid: (B, G) mean AP@k curve per row; measured: (B,)
        mAP measured at n = S; ratio: N / S.
    """
    lam_s = invert_decreasing(lam, ap_grid, measured)
    return interpolate(lam, ap_grid, lam_s * ratio)
