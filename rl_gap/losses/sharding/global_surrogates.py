"""The global AP surrogates gBlackBox and gSupAP on a list sharded over ranks (gSoftBin's
sharded form lives beside its kernel in ``rl_gap.losses.softbin``).

Each takes this rank's part of the flattened global list (its kept valid
pairs, flat order) and returns the single-process surrogate AP on every
rank; backward gives this rank's items' gradient. What crosses ranks:

- gBlackBox: the positives' (margin-shifted) scores (all-gather, O(P)) and, per
  global positive, the number of this rank's negatives scoring at or above
  it (all-reduce, O(P)); the blackbox backward does the same for the
  perturbed positives. Integer counts: exact.
- gSupAP: the positives' scores (all-gather) and per positive the partial
  negative rank sums (sigmoid part, counts and sums above the margin) and
  the σ' sums of the backward (all-reduce), O(P). The coefficients need
  the global ranks first, so the gradient takes a second local sweep.

Formulas and tie rules are those of ``blackbox_ap`` and
``supap_flat`` (one process); only where the sums run differs.
"""

from __future__ import annotations

import torch

from rl_gap import dist as shard_comm
from rl_gap.losses.ap_surrogate import pessimistic_ranks
from rl_gap.losses.common import sweep_with_gradient
from rl_gap.losses.supap_flat import (
    DEFAULT_BLOCK_ELEMENTS,
    SupAPParams,
    exact_part,
    margin_counts,
    step_gradient,
)


# ---------------------------------------------------------------------------- gBlackBox
def _count_at_least(sorted_values: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """``#{v : v >= q}`` for each query (``sorted_values`` ascending), int64."""
    return sorted_values.numel() - torch.searchsorted(sorted_values, queries, right=False)


class _ShardedBlackBoxAP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, positive, lambda_val, margin):  # type: ignore[override]
        rank, _ = shard_comm.require_group()
        work = scores.detach()
        shifted = work - margin * positive.to(work.dtype) if margin else work
        pos_local, neg_local = shifted[positive], shifted[~positive]
        sizes = shard_comm.all_gather_sizes(pos_local.numel(), work.device)
        pos_all = shard_comm.all_gather_ragged(pos_local, sizes)  # (P,) global order
        pos_sorted = pos_all.sort().values
        neg_sorted = neg_local.sort().values
        # Global negatives at or above each positive; the total list length.
        counts = torch.cat(
            [_count_at_least(neg_sorted, pos_all), torch.tensor([work.numel()], device=work.device)]
        )
        shard_comm.all_reduce(counts)
        neg_above, length = counts[:-1], float(counts[-1])
        num_pos = pos_all.numel()
        rank_pos = _count_at_least(pos_sorted, pos_all).to(work.dtype)  # among positives
        rank_all = (neg_above + _count_at_least(pos_sorted, pos_all)).to(work.dtype)
        ranks = rank_all / length  # normalised pessimistic rank r̃ of every global positive
        precision = rank_pos / (ranks * length)
        ap = precision.sum() / num_pos
        start = sum(sizes[:rank])
        mine = slice(start, start + pos_local.numel())
        ctx.save_for_backward(shifted, positive, pos_all, neg_sorted, rank_pos, ranks)
        ctx.lambda_val, ctx.length, ctx.mine, ctx.sizes = lambda_val, length, mine, sizes
        ctx.input_dtype = scores.dtype
        return ap

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):  # type: ignore[override]
        shifted, positive, pos_all, neg_sorted, rank_pos, ranks = ctx.saved_tensors
        lam, length = ctx.lambda_val, ctx.length
        # ∂AP/∂r̃ at the positives, as autograd forms it through rank_pos / (r̃ · n).
        with torch.enable_grad():
            r = ranks.detach().requires_grad_(True)
            ap = (rank_pos / (r * length)).sum() / pos_all.numel()
            (grad_ranks,) = torch.autograd.grad(ap, r, grad_output.to(r.dtype))
        perturbed = pos_all + lam * grad_ranks  # negatives' upstream gradient is 0: unmoved
        pert_sorted = perturbed.sort().values
        pos_sorted = pos_all.sort().values
        # Positives: global negatives at or above the perturbed score (all-reduced counts).
        neg_above_new = shard_comm.all_reduce(_count_at_least(neg_sorted, perturbed))
        rank_new = (neg_above_new + _count_at_least(pert_sorted, perturbed)).to(ranks.dtype)
        grad_pos = (rank_new / length - ranks) / lam
        # Negatives: only the positives crossing them change their rank.
        neg_local = shifted[~positive]
        crossed = _count_at_least(pert_sorted, neg_local) - _count_at_least(pos_sorted, neg_local)
        grad = torch.empty_like(shifted)
        grad[positive] = grad_pos[ctx.mine].to(grad.dtype)
        grad[~positive] = (crossed.to(grad.dtype) / length) / lam
        return grad.to(ctx.input_dtype), None, None, None


def sharded_blackbox_ap(scores, positive, lambda_val, margin) -> torch.Tensor:
    """BlackBox AP of the list concatenated over ranks ((n,) scores and positives per rank)."""
    return _ShardedBlackBoxAP.apply(scores, positive, float(lambda_val), float(margin))


# ------------------------------------------------------------------------------ gSupAP
def _sharded_supap_sweep(
    work: torch.Tensor,
    positive: torch.Tensor,
    params: SupAPParams,
    chunk_size: int | None,
    with_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Global SupAP and, with ``with_grad``, its gradient w.r.t. this rank's (n,) scores."""
    rank, _ = shard_comm.require_group()
    tau, _, _, margin, _ = params
    dtype = work.dtype
    pos_local, negs = work[positive], work[~positive]
    sizes = shard_comm.all_gather_sizes(pos_local.numel(), work.device)
    anchors = shard_comm.all_gather_ragged(pos_local, sizes)
    num_pos, num_neg = anchors.numel(), negs.numel()
    everyone = torch.ones(1, num_pos, dtype=torch.bool, device=work.device)
    rank_pos = pessimistic_ranks(anchors[None], everyone)[0].double()
    inv_tau, cap = 1.0 / tau, margin / tau
    negs_scaled, anchors_scaled = negs * inv_tau, anchors * inv_tau
    chunk = chunk_size or max(1, DEFAULT_BLOCK_ELEMENTS // max(1, num_neg))
    block = work.new_empty(min(chunk, num_pos), num_neg)

    def sweep(coef=None, grad_negs=None):
        sums = torch.zeros(num_pos, dtype=torch.float64, device=work.device)
        for start in range(0, num_pos, chunk):
            part = slice(start, min(start + chunk, num_pos))
            sig = block[: part.stop - part.start]
            torch.sub(negs_scaled.unsqueeze(0), anchors_scaled[part].unsqueeze(1), out=sig)
            sig.clamp_(max=cap).sigmoid_()
            if coef is None:
                sums[part] = sig.sum(1)
                continue
            deriv = sig.addcmul_(sig, sig, value=-1.0)
            sums[part] = deriv.sum(1)
            grad_negs += (coef[part] * inv_tau).to(dtype) @ deriv
        return sums

    packed = shard_comm.all_reduce(torch.cat([margin_counts(negs, anchors, margin), sweep()[None]]))
    counts, sig_sum = packed[:3], packed[3]
    rank_all = rank_pos + exact_part(counts, anchors, params) + sig_sum
    ap = (rank_pos / rank_all).sum() / num_pos
    if not with_grad:
        return ap.to(dtype), None
    coef = -rank_pos / (num_pos * rank_all.square())
    grad_negs = work.new_zeros(num_neg)
    dsig_sum = shard_comm.all_reduce(sweep(coef, grad_negs))
    step_negs, step_anchors = step_gradient(negs, anchors, coef, counts[0], params)
    grad_negs += step_negs.to(dtype)
    deriv_anchor = dsig_sum * inv_tau + step_anchors
    start = sum(sizes[:rank])
    mine = slice(start, start + pos_local.numel())
    grad = torch.zeros_like(work)
    grad[~positive] = grad_negs
    grad[positive] = (-coef[mine] * deriv_anchor[mine]).to(dtype)
    return ap.to(dtype), grad


def sharded_supap(
    scores: torch.Tensor, positive: torch.Tensor, params: SupAPParams, chunk_size: int | None
) -> torch.Tensor:
    """SupAP of the list concatenated over ranks ((n,) scores and positives per rank)."""
    return sweep_with_gradient(_sharded_supap_sweep, scores, positive, params, chunk_size)
