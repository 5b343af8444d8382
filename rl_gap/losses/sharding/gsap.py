"""gSAP on a batch matrix whose rows are sharded over ranks: the fast kernel and the exact sweep.

The flattened global list is the concatenation of every rank's flat valid
items in rank order (docs/definitions.md, "Sharded losses").

- Fast kernel (``fast_rank``): every quantity is a kernel sum over *all*
  items, and the grid moments that feed it add up over items. Each rank bins
  its own items (``fast_binning.fine_moments``, unchanged) and the coarse
  moments of the items and of the positives (a few (N + 2) × G_c tables, G_c
  the coarse cells) are all-reduced once; the grid plan comes from the
  all-reduced score range and item count, so every rank uses the plan one
  process would. The backward all-reduces the positives' weighted moments
  (2 × (N + 1) × G_c) and evaluates every local item's polynomial locally.
  Communication O(G_c · N) per step, independent of B.
- Exact sweep (``smoothed_ap.smoothed_ap_exact``): the positives' scores
  (P values) are all-gathered; each rank sums the sigmoids of its own items
  against every positive, the (2, P) partial ranks are all-reduced, and a
  second local sweep (the coefficients need the global ranks) accumulates
  the gradient. Communication O(P); time P · M / W per rank for each sweep.

Negative dropping uses ``shard_drop.sharded_drop_mask`` (the global
⌊α · N⌋ lowest negatives, ties in global flat order), the exact path's set.
"""

from __future__ import annotations

import math

import torch

from rl_gap import dist as shard_comm
from rl_gap.losses.common import compute_dtype, sweep_with_gradient
from rl_gap.losses.fast_sap import binning as fast_binning
from rl_gap.losses.fast_sap.binning import fine_moments
from rl_gap.losses.fast_sap.grid import (
    GridPlan,
    coarse_moments,
    coarse_position,
    plan_grid,
    point_moments,
)
from rl_gap.losses.fast_sap.kernel import (
    _positive_indices,
    check_fast_inputs,
    gradient_from_sums,
    ranks_from_moments,
)
from rl_gap.losses.sharding.drop import sharded_drop_mask
from rl_gap.losses.smoothed_ap import auto_chunk_size


def _global_stats(work, valid, pos_scores) -> dict:
    """What the one-process plan reads off the concatenated list, in one collective.

    Every rank's score ranges, item and positive counts and native-cache flag are
    all-gathered (7 values per rank) and reduced here: min/max for the ranges, sums
    for the counts (exact in float64 below 2^53), all() for the flag.
    """
    inf = math.inf
    lo_all, hi_all = (float(v) for v in torch.aminmax(work)) if work.numel() else (inf, -inf)
    lo_pos, hi_pos = (
        (float(v) for v in torch.aminmax(pos_scores)) if pos_scores.numel() else (inf, -inf)
    )
    cache = fast_binning.native_applicable(work, valid)
    local = torch.tensor(
        [lo_all, hi_all, lo_pos, hi_pos, work.numel(), pos_scores.numel(), float(cache)],
        dtype=torch.float64,
        device=work.device,
    )
    _, world = shard_comm.require_group()
    rows = shard_comm.all_gather_ragged(local[None], [1] * world).cpu()
    return dict(
        lo_all=float(rows[:, 0].min()),
        hi_all=float(rows[:, 1].max()),
        lo_pos=float(rows[:, 2].min()),
        hi_pos=float(rows[:, 3].max()),
        num_items=int(rows[:, 4].sum()),
        num_pos=int(rows[:, 5].sum()),
        cache=bool((rows[:, 6] > 0.5).all()),
    )


def _global_plan(stats: dict, temperature, tolerance, dtype) -> GridPlan:
    """The plan one process would make for the concatenated list."""
    if not (math.isfinite(stats["lo_all"]) and math.isfinite(stats["hi_all"])):
        raise ValueError("smoothed_ap_fast: scores contain NaN or infinite values")
    return plan_grid(
        stats["lo_all"],
        stats["hi_all"],
        stats["lo_pos"],
        stats["hi_pos"],
        stats["num_items"],
        temperature,
        tolerance,
        dtype,
        cache_tables=stats["cache"],
    )


def _forward_sums(scores, valid, pos_scores, plan: GridPlan):
    """``fast_rank._forward_sums`` with the additive moment tables all-reduced."""
    order = plan.coarse_order + 1
    fine = fine_moments(scores, plan, valid)  # this rank's items only
    cell, offset = coarse_position(pos_scores, plan)
    local_all = coarse_moments(fine, plan, order).T  # (N+2, G)
    ones = torch.ones_like(offset).unsqueeze(1)
    local_pos = point_moments(cell, offset, ones, plan, order)[0]  # (N+2, G)
    packed = torch.cat([local_all.reshape(-1), local_pos.reshape(-1), fine[-1, :1]])
    shard_comm.all_reduce(packed)
    size = local_all.numel()
    moments = packed[: 2 * size].view(2, *local_all.shape)  # (2, N+2, G): all items, positives
    above_window = packed[-1]
    return (*ranks_from_moments(moments, above_window, cell, offset, plan), cell, offset)


class _ShardedSmoothedAPFast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, positive, valid, temperature, tolerance, neg_drop):  # type: ignore[override]
        work = scores.detach()
        if neg_drop > 0:
            valid = sharded_drop_mask(work, positive, valid, neg_drop)
        pos_index = _positive_indices(positive, valid)
        pos_scores = work[pos_index].to(torch.float64)
        stats = _global_stats(work, valid, pos_scores)
        num_pos = stats["num_pos"]
        if num_pos == 0:
            raise ValueError("smoothed AP needs at least one (valid) positive item")
        plan = _global_plan(stats, temperature, tolerance, work.dtype)
        rank_all, rank_pos, deriv_all, deriv_pos, cell, offset = _forward_sums(
            work, valid, pos_scores, plan
        )
        total = shard_comm.all_reduce((rank_pos / rank_all).sum().reshape(1))
        ctx.plan, ctx.valid, ctx.num_pos = plan, valid, num_pos
        ctx.save_for_backward(
            work, pos_index, rank_all, rank_pos, deriv_all, deriv_pos, cell, offset
        )
        sap = total[0] / num_pos
        return sap.to(torch.float64 if scores.dtype == torch.float64 else torch.float32)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):  # type: ignore[override]
        work, pos_index, *sums = ctx.saved_tensors
        scale = grad_output.to(torch.float64) / (ctx.num_pos * ctx.plan.temperature)
        grad = gradient_from_sums(
            work, ctx.valid, pos_index, sums, ctx.plan, scale, reduce_moments=_sum_over_ranks
        )
        return grad, None, None, None, None, None


def _sum_over_ranks(moments: torch.Tensor) -> torch.Tensor:
    return shard_comm.all_reduce(moments.contiguous())


def sharded_smoothed_ap_fast(
    scores: torch.Tensor,
    positive: torch.Tensor,
    temperature: float,
    *,
    tolerance: float = 1e-8,
    valid: torch.Tensor | None = None,
    neg_drop: float = 0.0,
) -> torch.Tensor:
    """``fast_rank.smoothed_ap_fast`` of the list concatenated over ranks (every rank calls it).

    Args:
        scores: (n,) this rank's flat scores; positive, valid: (n,) bool.
        temperature, tolerance, neg_drop: as ``smoothed_ap_fast``.

    Returns:
        0-d global smoothed AP (the same on every rank); backward gives this
        rank's items' gradient. Raises ``PlanError`` on every rank alike, and the
        one-process kernel's ``ValueError`` for an input it refuses.
    """
    check_fast_inputs(scores, positive, temperature, tolerance, valid, neg_drop)
    return _ShardedSmoothedAPFast.apply(
        scores, positive, valid, float(temperature), float(tolerance), float(neg_drop)
    )


def _sigmoid_sums(items, num_local_pos, anchors, chunk, out, derivative, coef=None, grad=None):
    """Per anchor, sums over this rank's positive / negative items of σ (or σ') of (s_j − a).

    With ``coef`` (2, P) and ``derivative``, also adds ``coef @ σ'`` into ``grad``.
    """
    block = items.new_empty(min(chunk, anchors.numel()), items.numel())
    for start in range(0, anchors.numel(), chunk):
        part = slice(start, min(start + chunk, anchors.numel()))
        sig = block[: part.stop - part.start]
        torch.sub(items.unsqueeze(0), anchors[part].unsqueeze(1), out=sig)
        sig.sigmoid_()
        if derivative:
            sig.addcmul_(sig, sig, value=-1.0)  # σ' = σ − σ²
        out[0, part] = sig[:, :num_local_pos].sum(1)
        out[1, part] = sig[:, num_local_pos:].sum(1)
        if grad is not None:
            grad[:num_local_pos] += coef[0, part] @ sig[:, :num_local_pos]
            grad[num_local_pos:] += coef[1, part] @ sig[:, num_local_pos:]
    return out


def _sharded_exact_sweep(
    scores: torch.Tensor,
    positive: torch.Tensor,
    temperature: float,
    chunk_size: int | None,
    with_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Global smoothed AP (in ``scores.dtype``) and, with ``with_grad``, its gradient w.r.t.
    this rank's (n,) scores (in the compute dtype)."""
    work = scores.to(compute_dtype(scores.dtype))
    rank, _ = shard_comm.require_group()
    inv_tau = 1.0 / temperature
    pos_local, neg_local = work[positive], work[~positive]
    sizes = shard_comm.all_gather_sizes(pos_local.numel(), work.device)
    num_pos = sum(sizes)
    if num_pos == 0:
        raise ValueError("smoothed AP needs at least one positive item")
    anchors = shard_comm.all_gather_ragged(pos_local, sizes) * inv_tau  # (P,) global order
    items = torch.cat([pos_local, neg_local]) * inv_tau
    npl = pos_local.numel()
    chunk = chunk_size or auto_chunk_size(max(items.numel(), 1))
    sums = work.new_zeros(2, num_pos)
    if items.numel():
        _sigmoid_sums(items, npl, anchors, chunk, sums, derivative=False)
    shard_comm.all_reduce(sums)
    rank_pos = sums[0] + 0.5  # the self term σ(0) = 1/2 is in the sum: 1 + Σ_{j≠i}
    rank_neg = sums[1]
    rank_all = rank_pos + rank_neg
    sap = (rank_pos / rank_all).sum() / num_pos
    if not with_grad:
        return sap.to(scores.dtype), None
    inv_sq = rank_all.pow(-2) * (inv_tau / num_pos)
    coef = torch.stack([rank_neg * inv_sq, -rank_pos * inv_sq])  # ∂/∂R_P, ∂/∂R_N
    grad_items = work.new_zeros(items.numel())
    dsums = work.new_zeros(2, num_pos)
    if items.numel():
        _sigmoid_sums(items, npl, anchors, chunk, dsums, True, coef, grad_items)
    shard_comm.all_reduce(dsums)
    row = coef[0] * dsums[0] + coef[1] * dsums[1]
    start = sum(sizes[:rank])
    grad_items[:npl] -= row[start : start + npl]
    grad = torch.empty_like(work)
    grad[positive] = grad_items[:npl]
    grad[~positive] = grad_items[npl:]
    return sap.to(scores.dtype), grad


def sharded_smoothed_ap_exact(
    scores: torch.Tensor, positive: torch.Tensor, temperature: float, chunk_size: int | None = None
) -> torch.Tensor:
    """``smoothed_ap_exact`` of the list concatenated over ranks (every rank calls it).

    Args:
        scores: (n,) this rank's kept flat scores; positive: (n,) bool.
        temperature: τ > 0; chunk_size: anchors per block (None: ~2^24-element blocks).
    """
    return sweep_with_gradient(
        _sharded_exact_sweep, scores, positive, float(temperature), chunk_size
    )
