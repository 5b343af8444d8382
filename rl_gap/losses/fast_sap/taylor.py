"""Sigmoid derivatives and the Taylor remainder bounds behind the fast smoothed-AP kernel.

Every quantity of smoothed AP (ranks R_A, R_P and the gradient's σ' sums) is a
kernel sum ``sum_j w_j K((s_j − x)/τ)`` with K = σ or σ'. The fast kernel
(``rl_gap.losses.fast_sap.kernel``) replaces the exact source positions by their
offsets from grid-cell centres and Taylor-expands K in those offsets. This
module supplies

- ``sigmoid_derivatives(u, n)``: σ^(0..n)(u) in float64, accurate in both
  tails (evaluated at −|u| where σ is small, then reflected);
- ``relative_remainder(t, order, shift)``: a numerically evaluated bound on
  the Taylor remainder of σ^(shift) relative to σ^(shift) itself,

  ``sup_u sup_{|t'|<=t} |K(u+t') − sum_{n<=order} K^(n)(u) t'^n/n!| / K(u)``.

Why a *relative* bound exists at all: every derivative of σ is a polynomial in
σ times σ(1 − σ), so |K^(n)(u)| <= C_n K(u) for K = σ, σ'; and σ is analytic
in the strip |Im z| < π (poles at ±iπ), so the Taylor coefficients decay like
π^(−n). The remainder behaves like max(t^(order+1)/(order+1)!, (t/π)^(order+1))
— the first term from the exponential tails (σ(u+t)/σ(u) → e^t as u → −∞),
the second from the poles near u = 0. Because the bound is relative and all
weights of R_A, R_P and D_A, D_P are positive, it bounds the relative error
of those sums directly.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from functools import cache

import numpy as np
import torch


@cache
def _derivative_polynomials(max_order: int) -> np.ndarray:
    """Coefficients c[n, k] with σ^(n)(u) = sum_k c[n, k] σ(u)^k, n <= max_order.

    From σ' = σ − σ²: if σ^(n) = p_n(σ) then σ^(n+1) = p_n'(σ)(σ − σ²).
    """
    coef = np.zeros((max_order + 1, max_order + 2))
    coef[0, 1] = 1.0
    for n in range(max_order):
        p = np.polynomial.polynomial.Polynomial(coef[n])
        nxt = p.deriv() * np.polynomial.polynomial.Polynomial([0.0, 1.0, -1.0])
        coef[n + 1, : len(nxt.coef)] = nxt.coef[: max_order + 2]
    return coef


def sigmoid_derivatives(u: torch.Tensor, max_order: int) -> torch.Tensor:
    """σ^(n)(u) for n = 0..max_order, stacked on a new last axis.

    Evaluated at v = −|u| (σ(v) <= 1/2, so the polynomials in σ do not cancel
    in the tails) and reflected with σ(−v) = 1 − σ(v) and
    σ^(n)(−v) = (−1)^(n+1) σ^(n)(v) for n >= 1.

    Args:
        u: any-shape float tensor (computed in its dtype; use float64).
        max_order: highest derivative.

    Returns:
        tensor of shape ``u.shape + (max_order + 1,)``.
    """
    coef = torch.as_tensor(_derivative_polynomials(max_order), dtype=u.dtype, device=u.device)
    positive_side = u > 0
    sig = torch.sigmoid(-u.abs())
    # Horner over the polynomial degree, all orders at once: (..., n+1).
    out = coef[:, -1].expand(*u.shape, max_order + 1)
    sig_col = sig.unsqueeze(-1)
    for k in range(coef.shape[1] - 2, -1, -1):
        out = out * sig_col + coef[:, k]
    if max_order >= 0:
        signs = torch.tensor(
            [(-1.0) ** (n + 1) for n in range(max_order + 1)], dtype=u.dtype, device=u.device
        )
        flipped = out * signs
        flipped[..., 0] = 1.0 - out[..., 0]
        out = torch.where(positive_side.unsqueeze(-1), flipped, out)
    return out


MAX_TAYLOR_ORDER = 16


@contextmanager
def _single_thread():
    """Run tiny tensor ops on one thread: on an oversubscribed CPU the intra-op
    barrier of 2+ threads costs milliseconds per op, more than the ops themselves."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@cache
def _remainders(offset: float, shift: int, reference: int) -> np.ndarray:
    """Relative Taylor remainders of σ^(shift) for every order 0..MAX_TAYLOR_ORDER (see below)."""
    with _single_thread():
        return _remainders_impl(offset, shift, reference)


def _remainders_impl(offset: float, shift: int, reference: int) -> np.ndarray:
    u = torch.linspace(-40.0, 40.0, 2001, dtype=torch.float64)
    t = torch.linspace(-offset, offset, 9, dtype=torch.float64).unsqueeze(1)  # (9, 1)
    top = shift + MAX_TAYLOR_ORDER
    base = sigmoid_derivatives(u, top)[:, shift:]  # (U, orders): K^(n)(u)
    at_t = sigmoid_derivatives(u + t, max(shift, reference))  # (9, U, ...)
    exact = at_t[..., shift]
    # Relative to the true value at the item, not at the expansion centre.
    ref_val = at_t[..., reference].abs().clamp_min(1e-300)
    n = torch.arange(MAX_TAYLOR_ORDER + 1, dtype=torch.float64)
    scale = torch.exp(-torch.lgamma(n + 1))  # 1/n!
    terms = base * scale * t.unsqueeze(-1) ** n  # (9, U, orders)
    partial = terms.cumsum(-1)
    ratio = (exact.unsqueeze(-1) - partial).abs() / ref_val.unsqueeze(-1)
    return (1.1 * ratio.amax((0, 1)) + 1e-15).numpy()


def relative_remainder(
    offset: float, order: int, shift: int = 0, reference: int | None = None
) -> float:
    """Bound on the order-``order`` Taylor remainder of σ^(shift), relative to σ^(reference).

    ``sup_u sup_{|t| <= offset} |K(u + t) − sum_{n <= order} K^(n)(u) t^n / n!| / σ^(ref)(u + t)``
    with K = σ^(shift) and ref = ``reference`` (default ``shift``), evaluated
    on a grid of 2001 u in [−40, 40] (beyond it the ratio has reached its
    exponential-tail limit) and 9 offsets t in [−offset, offset] (the remainder grows
    monotonically in |t|, so the endpoints dominate), with a 10 %
    safety factor plus the float64 evaluation floor.

    Args:
        offset: largest |t| (in units of τ).
        order: Taylor order (terms 0..order kept), at most ``MAX_TAYLOR_ORDER``.
        shift: derivative order of the expanded kernel (0: σ, 1: σ').
        reference: derivative order of the kernel the error is measured
            against (0 or 1); defaults to ``shift``.

    Returns:
        the relative bound (a float).
    """
    if not 0 <= order <= MAX_TAYLOR_ORDER:
        raise ValueError(f"Taylor order must be in [0, {MAX_TAYLOR_ORDER}], got {order}")
    ref = shift if reference is None else reference
    return float(_remainders(float(offset), int(shift), int(ref))[order])


def fine_bound(offset: float, order: int) -> float:
    """Relative error of σ and σ' sums whose sources/queries are expanded to ``order`` at |t| <= offset."""
    return max(relative_remainder(offset, order, 0), relative_remainder(offset, order, 1))


def coarse_bound(offset: float, order: int, fine_offset: float, fine_order: int) -> float:
    """Relative error of the coarse-cell expansion applied to fine moments.

    The fine moment of order k carries (t_j h_f/τ)^k / k! <= fine_offset^k / k!
    times σ^(k) (σ^(k+1) for σ' sums), which the coarse level expands to order
    ``order − k`` about the coarse centre; the bound sums those remainders.
    """
    total = 0.0
    for k in range(fine_order + 1):
        weight = fine_offset**k / math.factorial(k)
        for shift, ref in ((0, 0), (1, 1)):
            total += weight * relative_remainder(offset, order - k, shift + k, ref)
    return total
