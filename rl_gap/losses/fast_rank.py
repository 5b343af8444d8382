"""Sub-quadratic smoothed AP: ``smoothed_ap_fast(scores, positive, τ, tolerance=...)``.

The exact smoothed AP (DESIGN §4) compares each of the P positives with all
M items: P × M sigmoids. Here every quantity is a *kernel sum*

    R_A(i) = 1/2 + sum_j σ((s_j − s_i)/τ)        R_P(i) = 1/2 + sum_{j in P} σ(...)
    D_A(i) = sum_j σ'((s_j − s_i)/τ)              D_P(i) = sum_{j in P} σ'(...)
    E_w(x) = sum_{i in P} w_i σ'((x − s_i)/τ)     (w = a or b, below)

(the j = i terms σ(0) = 1/2 and σ'(0) = 1/4 are included; see the gradient),
evaluated with the two-level grid of ``fast_grid``: O(M) binning passes
(no sort), O(P · U τ / h_c) band work, O(G) grid work, never O(P × M).

Gradient. With a_i = 1/R_A(i) and b_i = −R_P(i)/R_A(i)²,

    ∂SAP/∂s_k = 1/(|P| τ) · [ E_b(s_k) + [k in P] (E_a(s_k) − a_k D_P(k) − b_k D_A(k)) ]

(the self comparison enters E and D with opposite signs and cancels). E_b is
needed at every item: it is tabulated as a Taylor polynomial per fine cell,
so each item costs one gather and a short Horner.

Accuracy (the ``tolerance`` parameter): the grid is planned so that every
kernel sum has relative error <= tolerance/2 (Taylor remainders bounded in
``fast_kernels``, truncation beyond the band by 4·M·e^(−U)); since all
weights of R_A, R_P are positive, |ΔSAP| <= tolerance, and every gradient
term carries the same relative bound (only positives' entries, a difference
of four terms computed in float64, can lose it through cancellation).
"""

from __future__ import annotations

import math

import torch

from rl_gap.losses.fast_grid import (
    BAND_ELEMENTS,
    CHUNK_ELEMENTS,
    GridPlan,
    coarse_moments,
    coarse_position,
    fine_cells,
    fine_moments,
    plan_grid,
    taylor_to_fine,
)
from rl_gap.losses.fast_kernels import sigmoid_derivatives

# impl="auto": P × M comparisons above which the fast kernel wins, measured on
# this project's 2-core CPU (see the fast-kernel report); the exact sweep costs
# ~P × M sigmoid evaluations, the fast kernel ~40 passes over M plus a fixed
# planning/grid overhead.
FAST_MIN_COMPARISONS = 1 << 23


def prefer_fast(num_positives: int, num_items: int, temperature: float) -> bool:
    """Whether ``smoothed_ap_fast`` is expected to beat the exact P × M sweep.

    Args:
        num_positives: P; num_items: M; temperature: τ (the fast kernel's cost
            barely depends on it: band work is O(P · log(M/tol)) cells).
    """
    del temperature
    return num_positives * num_items >= FAST_MIN_COMPARISONS and num_positives >= 8


def _scaled_factors(plan: GridPlan, order: int, device: torch.device) -> torch.Tensor:
    """(h_c/τ)^n / n! for n = 0..order (float64)."""
    ratio = plan.h_coarse / plan.temperature
    return torch.tensor(
        [ratio**n / math.factorial(n) for n in range(order + 1)], dtype=torch.float64, device=device
    )


def _band(cell: torch.Tensor, offset: torch.Tensor, plan: GridPlan, max_order: int):
    """Band cells (padded-table rows) and σ^(0..max_order)((x_cell − s_i)/τ) for a chunk of positives.

    Returns:
        rows (c, 2K+1) int64 into tables padded by K rows on each side, and
        derivatives (c, 2K+1, max_order + 1) float64.
    """
    k = torch.arange(-plan.band, plan.band + 1, device=cell.device)
    rows = cell.unsqueeze(1) + k + plan.band
    u = (k.to(torch.float64) - offset.unsqueeze(1)) * (plan.h_coarse / plan.temperature)
    return rows, sigmoid_derivatives(u, max_order)


def _pad(table: torch.Tensor, plan: GridPlan) -> torch.Tensor:
    pad = table.new_zeros(plan.band, table.shape[1])
    return torch.cat([pad, table, pad])


def _forward_sums(scores, pos_scores, plan):
    """R_A, R_P, D_A, D_P at every positive (float64, (P,) each)."""
    device = scores.device
    nc = plan.coarse_order
    fine = fine_moments(scores, plan)
    all_moments = coarse_moments(fine, plan)
    above_window = fine[-1, 0]
    cell, offset = coarse_position(pos_scores, plan)
    powers = offset.unsqueeze(1) ** torch.arange(nc + 1, device=device, dtype=torch.float64)
    pos_moments = torch.zeros_like(all_moments).index_add_(0, cell, powers)
    factors = _scaled_factors(plan, nc, device)
    # One padded table: columns [all items | positives], scaled by (h_c/τ)^n / n!.
    table = _pad(torch.cat([all_moments * factors, pos_moments * factors], 1), plan)
    # Counts strictly above the band of a positive: suffix sums over coarse cells.
    counts = torch.stack([all_moments[:, 0], pos_moments[:, 0]], 1)
    suffix = torch.cat([counts.flip(0).cumsum(0).flip(0), counts.new_zeros(1, 2)])
    width = 2 * plan.band + 1
    per_chunk = max(1, BAND_ELEMENTS // width)
    sums = []
    for start in range(0, pos_scores.numel(), per_chunk):
        c, t = cell[start : start + per_chunk], offset[start : start + per_chunk]
        rows, deriv = _band(c, t, plan, nc + 1)
        gathered = table[rows]  # (c, W, 2(nc+1))
        g_all, g_pos = gathered[..., : nc + 1], gathered[..., nc + 1 :]
        sig, dsig = deriv[..., : nc + 1], deriv[..., 1:]
        above = suffix[(c + plan.band + 1).clamp_max(plan.num_coarse)]
        sums.append(
            torch.stack(
                [
                    (g_all * sig).sum((1, 2)) + above[:, 0] + above_window,
                    (g_pos * sig).sum((1, 2)) + above[:, 1],
                    (g_all * dsig).sum((1, 2)),
                    (g_pos * dsig).sum((1, 2)),
                ],
                1,
            )
        )
    rank_all, rank_pos, deriv_all, deriv_pos = torch.cat(sums).unbind(1)
    return rank_all + 0.5, rank_pos + 0.5, deriv_all, deriv_pos, cell, offset


def _gradient_tables(cell, offset, weights, plan):
    """Per coarse cell, Taylor coefficients of E_w(x_C + T h_c) = sum_l c_l T^l for each weight column.

    Args:
        cell, offset: (P,) coarse positions of the positives.
        weights: (P, q) float64 weight columns.

    Returns:
        (num_coarse + 2K, q, N_c + 1) padded tables.
    """
    nc, q = plan.coarse_order, weights.shape[1]
    factors = _scaled_factors(plan, nc, cell.device)
    table = weights.new_zeros(plan.num_coarse + 2 * plan.band, q * (nc + 1))
    width = 2 * plan.band + 1
    per_chunk = max(1, BAND_ELEMENTS // width)
    for start in range(0, cell.numel(), per_chunk):
        sl = slice(start, start + per_chunk)
        rows, deriv = _band(cell[sl], offset[sl], plan, nc + 1)
        coef = deriv[..., 1:] * factors  # (c, W, nc+1): σ^(l+1)(u) (h_c/τ)^l / l!
        values = coef.unsqueeze(2) * weights[sl, None, :, None]  # (c, W, q, nc+1)
        table.index_add_(0, rows.reshape(-1), values.reshape(-1, q * (nc + 1)))
    return table.reshape(-1, q, nc + 1)


class _SmoothedAPFast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, positive, temperature, tolerance):  # type: ignore[override]
        work = scores.detach()
        pos_index = positive.nonzero().squeeze(1)
        pos_scores = work[pos_index].to(torch.float64)
        lo_all, hi_all = (float(v) for v in torch.aminmax(work))
        lo_pos, hi_pos = (float(v) for v in torch.aminmax(pos_scores))
        if not (math.isfinite(lo_all) and math.isfinite(hi_all)):
            raise ValueError("smoothed_ap_fast: scores contain NaN or infinite values")
        plan = plan_grid(lo_all, hi_all, lo_pos, hi_pos, work.numel(), temperature, tolerance)
        rank_all, rank_pos, deriv_all, deriv_pos, cell, offset = _forward_sums(
            work, pos_scores, plan
        )
        sap = (rank_pos / rank_all).mean()
        ctx.plan = plan
        ctx.save_for_backward(
            work, pos_index, rank_all, rank_pos, deriv_all, deriv_pos, cell, offset
        )
        return sap.to(scores.dtype if scores.dtype == torch.float64 else torch.float32)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):  # type: ignore[override]
        work, pos_index, rank_all, rank_pos, deriv_all, deriv_pos, cell, offset = ctx.saved_tensors
        plan: GridPlan = ctx.plan
        scale = grad_output.to(torch.float64) / (pos_index.numel() * plan.temperature)
        coef_a = 1.0 / rank_all
        coef_b = -rank_pos / rank_all**2
        tables = _gradient_tables(cell, offset, torch.stack([coef_a, coef_b], 1), plan)
        # E_a, E_b at the positives, from their coarse cell's polynomial (float64).
        nc = plan.coarse_order
        powers = offset.unsqueeze(1) ** torch.arange(
            nc + 1, device=work.device, dtype=torch.float64
        )
        at_pos = (tables[cell + plan.band] * powers.unsqueeze(1)).sum(2)  # (P, 2)
        pos_grad = at_pos.sum(1) - coef_a * deriv_pos - coef_b * deriv_all
        # E_b at every item, from its fine cell's short polynomial.
        inner = tables[plan.band : plan.band + plan.num_coarse, 1] * scale
        fine_table = taylor_to_fine(inner, plan)  # (num_fine + 2, N_f + 1)
        grad = torch.empty(work.shape, dtype=work.dtype, device=work.device)
        for start in range(0, work.numel(), CHUNK_ELEMENTS):
            row, t = fine_cells(work[start : start + CHUNK_ELEMENTS], plan)
            coef = fine_table[row]  # (n, N_f + 1)
            acc = coef[:, -1].clone()
            for k in range(plan.fine_order - 1, -1, -1):
                acc.mul_(t).add_(coef[:, k])
            grad[start : start + row.numel()] = acc
        grad[pos_index] = (pos_grad * scale).to(grad.dtype)
        return grad, None, None, None


def smoothed_ap_fast(
    scores: torch.Tensor,
    positive: torch.Tensor,
    temperature: float,
    *,
    tolerance: float = 1e-7,
) -> torch.Tensor:
    """Smoothed AP of one flat ranked list in O(M) time and memory (no P × M work, no sort).

    Same value as ``rl_gap.losses.smoothed_ap.smoothed_ap_exact`` up to ``tolerance``.

    Args:
        scores: (M,) float scores (float16/bfloat16 are computed exactly in float64).
        positive: (M,) bool, True for relevant items; needs >= 1 True.
        temperature: sigmoid temperature τ > 0.
        tolerance: bound on |SAP_fast − SAP_exact| (and the relative error of
            every rank and gradient kernel sum is <= tolerance / 2).

    Returns:
        0-d smoothed AP (float64 for float64 scores, else float32),
        differentiable w.r.t. ``scores`` (first order).
    """
    if not isinstance(scores, torch.Tensor) or not torch.is_floating_point(scores):
        raise ValueError(
            f"scores must be a floating tensor, got {getattr(scores, 'dtype', scores)}"
        )
    if (
        scores.dim() != 1
        or not isinstance(positive, torch.Tensor)
        or positive.shape != scores.shape
    ):
        raise ValueError(
            "smoothed_ap_fast expects 1-D scores and a positive mask of the same shape, got "
            f"{tuple(scores.shape)} and {tuple(getattr(positive, 'shape', ()))}"
        )
    if positive.dtype != torch.bool:
        raise ValueError(f"positive must be a bool tensor, got {positive.dtype}")
    if not temperature > 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    if not 1e-13 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [1e-13, 1), got {tolerance}")
    if not bool(positive.any()):
        raise ValueError("smoothed AP needs at least one positive item")
    return _SmoothedAPFast.apply(scores, positive, float(temperature), float(tolerance))
