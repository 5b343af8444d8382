"""Sub-quadratic smoothed AP: ``smoothed_ap_fast(scores, positive, τ, tolerance=...)``.

The exact smoothed AP (docs/definitions.md) compares each of the P positives with all
M items: P × M sigmoids. Here every quantity is a *kernel sum*

    R_A(i) = 1/2 + sum_j σ((s_j − s_i)/τ)        R_P(i) = 1/2 + sum_{j in P} σ(...)
    D_A(i) = sum_j σ'((s_j − s_i)/τ)              D_P(i) = sum_{j in P} σ'(...)
    E_w(x) = sum_{i in P} w_i σ'((x − s_i)/τ)     (w = a or b, below)

(the j = i terms σ(0) = 1/2 and σ'(0) = 1/4 are included; see the gradient),
evaluated with the two-level grid of ``grid`` / ``binning``: a few
O(M) elementwise passes and scatter/gathers (no sort; on CPU one fused pass
each way in the optional ``native`` library), an O(G log G) FFT
correlation on the coarse grid (G ≈ score window / (τ/2^k) cells, at most a
few 10^4 for cosine scores at τ = 1e-4), O(P) per positive; never O(P × M).
Memory: O(G) tables plus fixed-size chunk buffers (no M-sized temporaries
besides the gradient itself).

Gradient. With a_i = 1/R_A(i) and b_i = −R_P(i)/R_A(i)²,

    ∂SAP/∂s_k = 1/(|P| τ) · [ E_b(s_k) + [k in P] (E_a(s_k) − a_k D_P(k) − b_k D_A(k)) ]

(the self comparison enters E and D with opposite signs and cancels). E_b is
needed at every item: it is tabulated as a Taylor polynomial per fine cell,
so each item costs one gather and a short Horner.

Accuracy (the ``tolerance`` parameter): the grid is planned so that every
kernel sum has relative error <= tolerance/2 (Taylor remainders bounded in
``taylor``, truncation beyond the band by 4·M·e^(−U)); since all
weights of R_A, R_P are positive, |ΔSAP| <= tolerance, and every gradient
term carries the same relative bound (only positives' entries, a difference
of four terms computed in float64, can lose it through cancellation).
"""

from __future__ import annotations

import math

import torch

from rl_gap.losses.fast_sap import binning as fast_binning
from rl_gap.losses.fast_sap import drop as fast_drop
from rl_gap.losses.fast_sap import native as fast_native
from rl_gap.losses.fast_sap.binning import evaluate_fine, fine_moments
from rl_gap.losses.fast_sap.grid import (
    GridPlan,
    PlanError,
    coarse_moments,
    coarse_position,
    correlate_band,
    moment_factors,
    plan_grid,
    point_moments,
    query_powers,
    taylor_to_fine,
)
from rl_gap.precision import full_precision

__all__ = ["PlanError", "prefer_fast", "smoothed_ap_fast"]

# impl="auto": the exact sweep costs ~P × M sigmoid evaluations; the fast kernel
# two passes over M plus O(G log G) grid work, G ~ score window / τ cells. On
# this project's 2-core CPU (float32, square batches, 4 per class, native passes)
# the fast kernel won from P × M ≈ 1e6-6e6 at τ >= 1e-2 (B = 64: exact 3 ms,
# fast 4-5 ms; B = 128: 20 ms vs 4-5 ms) and P × M ≈ 6e6 at τ = 1e-4 (a ~30 ms
# grid fixed cost for cosine scores): the threshold below is on the safe side.
FAST_MIN_COMPARISONS = 1 << 22
# On a GPU the exact sweep's P × M sigmoids are one wide elementwise workload while the
# fast kernel pays ~10^2 launches and a few host syncs per step whatever the size, so the
# crossover moves up; estimated from those counts (benchmarks/bench_gpu.py measures it).
DEVICE_FAST_MIN_COMPARISONS = 1 << 30


def prefer_fast(
    num_positives: int,
    num_items: int,
    temperature: float,
    device: torch.device | str | None = None,
) -> bool:
    """Whether ``smoothed_ap_fast`` is expected to beat the exact P × M sweep.

    Args:
        num_positives: P; num_items: M; temperature: τ (smaller τ means a finer
            grid, so the fast kernel needs a larger problem to pay off).
        device: where the scores live (None: the CPU); accelerators have their own
            threshold.
    """
    on_cpu = device is None or torch.device(device).type == "cpu"
    base = FAST_MIN_COMPARISONS if on_cpu else DEVICE_FAST_MIN_COMPARISONS
    threshold = base * max(1.0, math.sqrt(1e-3 / temperature))
    return num_positives * num_items >= threshold


def _forward_sums(scores: torch.Tensor, valid, pos_scores: torch.Tensor, plan: GridPlan):
    """R_A, R_P, D_A, D_P at every positive (float64, (P,) each), and the positives' cells.

    One correlation gives both kernels: with the σ sums expanded to order N + 1,
    their rows l + 1 are exactly the σ' sums' rows l at order N (both read
    ``sum_{n <= N−l} m̃_n σ^(1+n+l)``), i.e. D is the T-derivative of R's expansion.
    """
    order = plan.coarse_order + 1
    fine = fine_moments(scores, plan, valid)
    above_window = fine[-1, 0]
    cell, offset = coarse_position(pos_scores, plan)
    all_moments = coarse_moments(fine, plan, order).T.unsqueeze(0)  # (1, N+2, G)
    ones = torch.ones_like(offset).unsqueeze(1)
    pos_moments = point_moments(cell, offset, ones, plan, order)
    moments = torch.cat([all_moments, pos_moments])  # (2, N+2, G)
    return (*ranks_from_moments(moments, above_window, cell, offset, plan), cell, offset)


def ranks_from_moments(moments, above_window, cell, offset, plan: GridPlan):
    """R_A, R_P, D_A, D_P at every positive from the coarse moment tables.

    Args:
        moments: (2, N+2, G) order-(N+1) moments of all items and of the positives, summed
            over ranks when the list is sharded (the tables add up over items).
        above_window: 0-d count of the items above the grid window (each counts 1).
        cell, offset: the positives' coarse positions (``coarse_position``).
    """
    order = plan.coarse_order + 1
    factors = moment_factors(order, plan.ratio, moments.device)
    grid = correlate_band(moments * factors.unsqueeze(1), plan, shifts=(0,), order=order)
    at_cell = grid[:, 0].index_select(2, cell)  # (2, N+2, P)
    powers = query_powers(offset, plan, order)  # (N+2, P)
    sigma = (at_cell * powers).sum(1)  # (2, P)
    deriv = (at_cell[:, 1:] * powers[:-1]).sum(1)
    # Items in cells above a positive's band count exactly 1 each (suffix sums).
    counts = moments[:, 0]  # (2, G)
    suffix = torch.cat([counts.flip(1).cumsum(1).flip(1), counts.new_zeros(2, 1)], 1)
    above = suffix[:, (cell + plan.band + 1).clamp_max(plan.num_coarse)]  # (2, P)
    rank_all = sigma[0] + above[0] + above_window + 0.5
    rank_pos = sigma[1] + above[1] + 0.5
    return rank_all, rank_pos, deriv[0], deriv[1]


def _positive_indices(positive: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """Ascending flat indices of the valid positives, (P,) int64."""
    index = fast_native.select(positive, valid) if fast_binning.USE_NATIVE else None
    if index is None:
        mask = positive if valid is None else positive & valid
        index = mask.nonzero().squeeze(1)
    return index


class _SmoothedAPFast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, positive, valid, temperature, tolerance, neg_drop):  # type: ignore[override]
        work = scores.detach()
        if neg_drop > 0:
            # Dropped negatives become invalid items: out of every sum, zero gradient.
            valid = fast_drop.drop_mask(work, positive, valid, neg_drop)
        pos_index = _positive_indices(positive, valid)
        if pos_index.numel() == 0:
            raise ValueError("smoothed AP needs at least one (valid) positive item")
        pos_scores = work[pos_index].to(torch.float64)
        lo_all, hi_all = (float(v) for v in torch.aminmax(work))
        lo_pos, hi_pos = (float(v) for v in torch.aminmax(pos_scores))
        if not (math.isfinite(lo_all) and math.isfinite(hi_all)):
            raise ValueError("smoothed_ap_fast: scores contain NaN or infinite values")
        plan = plan_grid(
            lo_all,
            hi_all,
            lo_pos,
            hi_pos,
            work.numel(),
            temperature,
            tolerance,
            work.dtype,
            cache_tables=fast_binning.native_applicable(work, valid),
        )
        rank_all, rank_pos, deriv_all, deriv_pos, cell, offset = _forward_sums(
            work, valid, pos_scores, plan
        )
        sap = (rank_pos / rank_all).mean()
        ctx.plan = plan
        ctx.valid = valid
        ctx.save_for_backward(
            work, pos_index, rank_all, rank_pos, deriv_all, deriv_pos, cell, offset
        )
        return sap.to(torch.float64 if scores.dtype == torch.float64 else torch.float32)

    @staticmethod
    @torch.autograd.function.once_differentiable
    @full_precision
    def backward(ctx, grad_output):  # type: ignore[override]
        work, pos_index, *sums = ctx.saved_tensors
        scale = grad_output.to(torch.float64) / (pos_index.numel() * ctx.plan.temperature)
        grad = gradient_from_sums(work, ctx.valid, pos_index, sums, ctx.plan, scale)
        return grad, None, None, None, None, None


def gradient_from_sums(work, valid, pos_index, sums, plan: GridPlan, scale, reduce_moments=None):
    """``scale`` · ∂SAP/∂s for every item (module docstring, "Gradient"), in ``work``'s dtype.

    Args:
        work: (M,) detached scores; valid: the forward's mask (None: all items).
        pos_index: (P,) flat indices of the valid positives.
        sums: ``(R_A, R_P, D_A, D_P, cell, offset)`` at the positives, from the forward.
        scale: 0-d float64, the incoming gradient over |P| τ (|P| over all ranks).
        reduce_moments: applied to the positives' (2, N+1, G) weighted moments before the
            correlation; the sharded kernel all-reduces them there, so E_a, E_b cover
            every rank's positives.
    """
    rank_all, rank_pos, deriv_all, deriv_pos, cell, offset = sums
    coef_a = 1.0 / rank_all
    coef_b = -rank_pos / rank_all**2
    weights = torch.stack([coef_a, coef_b], 1)
    moments = point_moments(cell, offset, weights, plan)
    if reduce_moments is not None:
        moments = reduce_moments(moments)
    moments = moments * moment_factors(plan.coarse_order, plan.ratio, work.device).unsqueeze(1)
    grid = correlate_band(moments, plan, shifts=(1,))[:, 0]  # (2, N+1, G): E_a, E_b
    # E_a, E_b at the positives, from their coarse cell's polynomial in T.
    at_pos = (grid.index_select(2, cell) * query_powers(offset, plan)).sum(1)  # (2, P)
    pos_grad = at_pos.sum(0) - coef_a * deriv_pos - coef_b * deriv_all
    # E_b at every item: Taylor coefficients in T (coarse units), re-expanded per fine cell.
    taylor = grid[1].T * moment_factors(plan.coarse_order, -plan.ratio, work.device)
    fine_table = taylor_to_fine(taylor * scale, plan)  # (G_f + 2, N_f + 1)
    grad = torch.empty_like(work)
    # Invalid items are binned into the empty sink row: their gradient is 0.
    evaluate_fine(work, plan, fine_table, grad, valid)
    grad[pos_index] = (pos_grad * scale).to(grad.dtype)
    return grad


def check_fast_inputs(
    scores: torch.Tensor,
    positive: torch.Tensor,
    temperature: float,
    tolerance: float,
    valid: torch.Tensor | None,
    neg_drop: float,
) -> None:
    """Refuse what the fast kernels cannot take (one ``ValueError`` naming the input): the
    one-process :func:`smoothed_ap_fast` and its sharded form check the same."""
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
            "the fast smoothed-AP kernel expects 1-D scores and a positive mask of the same shape, got "
            f"{tuple(scores.shape)} and {tuple(getattr(positive, 'shape', ()))}"
        )
    if positive.dtype != torch.bool:
        raise ValueError(f"positive must be a bool tensor, got {positive.dtype}")
    if not temperature > 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    if not 1e-13 <= tolerance < 1:  # also rejects NaN
        raise ValueError(f"tolerance must be in [1e-13, 1), got {tolerance}")
    if not 0.0 <= neg_drop < 1.0:
        raise ValueError(f"neg_drop must be in [0, 1), got {neg_drop}")
    if valid is not None:
        if not isinstance(valid, torch.Tensor) or valid.shape != scores.shape:
            raise ValueError(f"valid must be a bool tensor of shape {tuple(scores.shape)}")
        if valid.dtype != torch.bool:
            raise ValueError(f"valid must be a bool tensor, got {valid.dtype}")


def smoothed_ap_fast(
    scores: torch.Tensor,
    positive: torch.Tensor,
    temperature: float,
    *,
    tolerance: float = 1e-8,
    valid: torch.Tensor | None = None,
    neg_drop: float = 0.0,
) -> torch.Tensor:
    """Smoothed AP of one flat ranked list in O(M) time and memory (no P × M work, no sort).

    Same value as ``rl_gap.losses.smoothed_ap.smoothed_ap_exact`` up to ``tolerance``.

    Args:
        scores: (M,) float scores (float16/bfloat16 are computed exactly in float64).
        positive: (M,) bool, True for relevant items; needs >= 1 True.
        temperature: sigmoid temperature τ > 0.
        tolerance: bound on |SAP_fast − SAP_exact| (and the relative error of
            every rank and gradient kernel sum is <= tolerance / 2).
        valid: optional (M,) bool; False items are left out of the list (and
            get zero gradient). Passing a flat view of the whole matrix with its
            ``valid`` mask avoids materialising ``sim[valid]`` (an M-sized copy).
        neg_drop: α in [0, 1): drop the ``floor(α · N)`` lowest-scoring valid
            negatives first (ties: lower flat index first), the set
            ``rl_gap.losses.common.drop_lowest_negatives`` drops from ``scores[valid]``;
            found by a threshold (``drop``), not a sort. Dropped items get zero gradient.

    Raises:
        PlanError (a ValueError): no grid reaches ``tolerance`` (e.g. τ = 1e-6 over
            cosine scores, or scores far outside [-1, 1] at τ = 0.01); nothing was computed.

    Returns:
        0-d smoothed AP (float64 for float64 scores, else float32),
        differentiable w.r.t. ``scores`` (first order).
    """
    check_fast_inputs(scores, positive, temperature, tolerance, valid, neg_drop)
    # The "no valid positive" check happens in the forward, on the selected indices.
    return _SmoothedAPFast.apply(
        scores, positive, valid, float(temperature), float(tolerance), float(neg_drop)
    )
