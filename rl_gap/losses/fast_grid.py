"""Two-level uniform grid for the fast smoothed-AP kernel: planning, moments, band sums.

Scores are binned (no sort) into a *fine* grid of step h_f = h_c / 2^r inside
a *coarse* grid of step h_c (both powers of two, so every cell centre is an
exactly representable float and the offsets s − centre are exact).

- Sources (all M items) -> fine moments ``sum_j t_j^k``, k <= N_f (t_j the
  offset from the fine centre in fine units): O(M) elementwise passes and
  scatter-adds, no sort -> shifted exactly to coarse moments of order N_c
  (one small matmul; "moment-to-moment" translation).
- Queries (the P positives) -> kernel sums over the coarse cells within
  ``U`` temperatures (the band); cells farther above contribute exactly
  their count (σ = 1 to the tolerance, a suffix sum), farther below nothing.
- Backward: the positives' weighted σ' contributions are scattered onto the
  coarse cells of their band as Taylor coefficients of order N_c, translated
  to fine cells of order N_f, and every item reads its cell's cubic/quartic.

Error bound (relative, per kernel sum, see ``fast_kernels``):
``fine_bound(t_f, N_f) + coarse_bound(t_c, N_c) + 4·M·e^(−U)`` with
t_f = (1/2 + rounding) h_f/τ and t_c = h_c/(2τ); plus float64 rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import torch

from rl_gap.losses.fast_kernels import coarse_bound, fine_bound

# Items per chunk of the O(M) passes: small enough for the chunk's float64
# temporaries to stay in cache, large enough to amortise Python overhead.
CHUNK_ELEMENTS = 1 << 17
# Band (query × cell) pairs per chunk of the O(P · band) work.
BAND_ELEMENTS = 1 << 16
FINE_ORDERS = (3, 4, 5)
COARSE_ORDERS = (6, 8, 10, 12, 14, 16)
MAX_FINE_CELLS = 1 << 23


def _quantize_up(x: float) -> float:
    """Round up to the grid 2^(k/8), so that cached bounds are reused (conservative)."""
    return 2.0 ** (math.ceil(8.0 * math.log2(x)) / 8.0)


@cache
def _fine_bound_q(offset_q: float, order: int) -> float:
    return fine_bound(offset_q, order)


@cache
def _coarse_bound_q(offset_q: float, order: int, fine_offset_q: float, fine_order: int) -> float:
    return coarse_bound(offset_q, order, fine_offset_q, fine_order)


@dataclass(frozen=True)
class GridPlan:
    """Grid geometry and expansion orders for one call.

    Attributes:
        lo: lower edge of the grid window (a multiple of ``h_coarse``).
        h_coarse, h_fine: cell steps (powers of two), h_fine = h_coarse / 2^refine.
        refine: log2 of fine cells per coarse cell.
        num_coarse, num_fine: cell counts of the window (num_fine = num_coarse · 2^refine).
        fine_order, coarse_order: Taylor orders N_f, N_c.
        band: half-width K of the band in coarse cells (beyond: saturated).
        temperature: τ.
        bound: the guaranteed relative error of every kernel sum.
    """

    lo: float
    h_coarse: float
    h_fine: float
    refine: int
    num_coarse: int
    num_fine: int
    fine_order: int
    coarse_order: int
    band: int
    temperature: float
    bound: float


def plan_grid(
    lo_all: float,
    hi_all: float,
    lo_pos: float,
    hi_pos: float,
    num_items: int,
    temperature: float,
    tolerance: float,
) -> GridPlan:
    """Choose the grid and orders so that every kernel sum has relative error <= tolerance/2.

    Budget: fine expansion tolerance/4, coarse expansion tolerance/16,
    band truncation tolerance/16 (the rest is slack for float64 rounding).
    Since |Δ(R_P/R_A)| <= 2·(relative error of the sums), |ΔSAP| <= tolerance.

    Args:
        lo_all, hi_all: score range of all items; lo_pos, hi_pos: of the positives.
        num_items: M.
        temperature: τ.
        tolerance: bound on the absolute error of SAP.
    """
    tau = temperature
    h_coarse = 2.0 ** math.floor(math.log2(tau))
    ratio = h_coarse / tau  # in (1/2, 1]
    truncation = tolerance / 16.0
    reach = math.log(4.0 * max(num_items, 1) / truncation)  # U, in units of τ
    band = math.ceil(reach / ratio) + 2
    window_lo = max(lo_all, lo_pos - reach * tau)
    window_hi = min(hi_all, hi_pos + reach * tau)
    lo = math.floor(window_lo / h_coarse) * h_coarse
    num_coarse = int(math.floor((window_hi - lo) / h_coarse)) + 1
    coarse_offset = _quantize_up(0.5 * ratio)
    for fine_order in FINE_ORDERS:
        for refine in range(0, 16):
            num_fine = num_coarse << refine
            # float64 binning: the offset may exceed 1/2 cell by the rounding of (s − lo)/h_f.
            slack = num_fine * 2.0**-50
            fine_offset = _quantize_up((0.5 + slack) * ratio / 2**refine)
            if _fine_bound_q(fine_offset, fine_order) <= tolerance / 4.0:
                break
        else:
            continue
        if num_fine <= MAX_FINE_CELLS:
            break
    else:
        raise ValueError(
            f"fast smoothed AP cannot reach tolerance {tolerance:g} at temperature {tau:g} over a "
            f"score window of width {window_hi - window_lo:g} within {MAX_FINE_CELLS} grid cells; "
            "use the exact implementation or a larger tolerance"
        )
    for coarse_order in COARSE_ORDERS:
        err = _coarse_bound_q(coarse_offset, coarse_order, fine_offset, fine_order)
        if err <= tolerance / 16.0:
            break
    else:
        raise ValueError(f"fast smoothed AP cannot reach tolerance {tolerance:g}")
    bound = _fine_bound_q(fine_offset, fine_order) + err + truncation
    return GridPlan(
        lo=lo,
        h_coarse=h_coarse,
        h_fine=h_coarse / 2**refine,
        refine=refine,
        num_coarse=num_coarse,
        num_fine=num_fine,
        fine_order=fine_order,
        coarse_order=coarse_order,
        band=band,
        temperature=tau,
        bound=bound,
    )


def fine_cells(chunk: torch.Tensor, plan: GridPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Fine cell row (0 = below the window, num_fine + 1 = above) and offset of each score.

    Args:
        chunk: (n,) scores, any float dtype (computed in float64).
        plan: the grid.

    Returns:
        (row (n,) int64, t (n,) float64 in about [−1/2, 1/2] fine units; 0 in the sinks).
    """
    x = chunk.to(torch.float64, copy=True)
    inv_h = 1.0 / plan.h_fine
    cell = (x * inv_h).sub_(plan.lo * inv_h).floor_().clamp_(-1.0, float(plan.num_fine))
    # centre = lo + (cell + 1/2) h_f, exact (h_f a power of two, lo a multiple of h_c).
    t = x.sub_(cell * plan.h_fine).sub_(plan.lo + 0.5 * plan.h_fine).mul_(inv_h)
    inside = (cell >= 0) & (cell < plan.num_fine)
    t = t.mul_(inside)
    return cell.add_(1.0).long(), t


def fine_moments(scores: torch.Tensor, plan: GridPlan) -> torch.Tensor:
    """Per fine cell, ``sum_j t_j^k`` for k = 0..N_f over all items (float64).

    Returns:
        (num_fine + 2, N_f + 1); row 0 collects the items below the window,
        the last row those above it (only their counts are used).
    """
    order = plan.fine_order
    rows = plan.num_fine + 2
    moments = [
        torch.zeros(rows, dtype=torch.float64, device=scores.device) for _ in range(order + 1)
    ]
    ones = torch.ones(
        min(CHUNK_ELEMENTS, scores.numel()), dtype=torch.float64, device=scores.device
    )
    for start in range(0, scores.numel(), CHUNK_ELEMENTS):
        row, t = fine_cells(scores[start : start + CHUNK_ELEMENTS], plan)
        moments[0].index_add_(0, row, ones[: row.numel()])
        power = t
        moments[1].index_add_(0, row, power)
        for k in range(2, order + 1):
            power = power * t
            moments[k].index_add_(0, row, power)
    return torch.stack(moments, 1)


def _fine_offsets(plan: GridPlan, device: torch.device) -> torch.Tensor:
    """Offsets of the fine-cell centres from their coarse centre, in coarse units."""
    per = 2**plan.refine
    return (torch.arange(per, dtype=torch.float64, device=device) + 0.5) / per - 0.5


def coarse_moments(fine: torch.Tensor, plan: GridPlan) -> torch.Tensor:
    """Translate fine moments to coarse-cell moments ``sum_j T_j^n``, n <= N_c (T in coarse units).

    T_j = o_f + t_j / 2^r, so T^n = sum_k C(n, k) o_f^(n−k) 2^(−rk) t^k; terms with
    k > N_f are unknown and dropped (that is the fine expansion's error).

    Returns:
        (num_coarse, N_c + 1) float64.
    """
    per, nf, nc = 2**plan.refine, plan.fine_order, plan.coarse_order
    offsets = _fine_offsets(plan, fine.device)
    shift = torch.zeros(per, nf + 1, nc + 1, dtype=torch.float64, device=fine.device)
    for n in range(nc + 1):
        for k in range(min(n, nf) + 1):
            shift[:, k, n] = math.comb(n, k) * offsets ** (n - k) * 2.0 ** (-plan.refine * k)
    inner = fine[1:-1].reshape(plan.num_coarse, per * (nf + 1))
    return inner @ shift.reshape(per * (nf + 1), nc + 1)


def taylor_to_fine(coarse_coef: torch.Tensor, plan: GridPlan) -> torch.Tensor:
    """Re-expand per-coarse-cell Taylor coefficients about the fine centres, truncated to N_f.

    Args:
        coarse_coef: (num_coarse, N_c + 1), f(x_C + T h_c) = sum_l c_l T^l.

    Returns:
        (num_fine + 2, N_f + 1) with f(x_f + t h_f) ≈ sum_l' d_l' t^l'; sink rows 0.
    """
    per, nf, nc = 2**plan.refine, plan.fine_order, plan.coarse_order
    offsets = _fine_offsets(plan, coarse_coef.device)
    shift = torch.zeros(nc + 1, per, nf + 1, dtype=torch.float64, device=coarse_coef.device)
    for l in range(nc + 1):  # noqa: E741
        for lp in range(min(l, nf) + 1):
            shift[l, :, lp] = math.comb(l, lp) * offsets ** (l - lp) * 2.0 ** (-plan.refine * lp)
    inner = (coarse_coef @ shift.reshape(nc + 1, per * (nf + 1))).reshape(plan.num_fine, nf + 1)
    pad = inner.new_zeros(1, nf + 1)
    return torch.cat([pad, inner, pad])


def coarse_position(scores: torch.Tensor, plan: GridPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Coarse cell index and offset (coarse units, float64) of in-window scores (the positives)."""
    x = (scores.to(torch.float64) - plan.lo) / plan.h_coarse
    cell = x.floor().clamp_(0, plan.num_coarse - 1)
    return cell.long(), x - cell - 0.5
