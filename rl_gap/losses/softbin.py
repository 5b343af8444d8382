"""SoftBin AP: FastAP-style soft histogram binning (Cakir et al., CVPR 2019), per query and global.

FastAP replaces each item's rank by its position on a fixed grid: ``num_bins``
= L equal intervals, so L + 1 bin centres, as in FastAP's released code
(``Delta = 4/num_bins``, ``Z = linspace(0, 4, num_bins + 1)``). Here the grid
runs over similarities: bin centres ``z_l = hi − l·Δ`` (l = 0 … L,
Δ = (hi − lo)/L; bin 0 holds the highest similarities),
and every item spreads a unit mass over the two nearest centres with the
triangular kernel ``δ(s, z_l) = max(0, 1 − |s − z_l|/Δ)``. With

    h_l  = Σ_{i in A} δ(s_i, z_l),   H_l  = Σ_{k ≤ l} h_k      (all items)
    h⁺_l = Σ_{i in P} δ(s_i, z_l),   H⁺_l = Σ_{k ≤ l} h⁺_k     (positives)

    SoftBinAP = (1/|P|) Σ_l h⁺_l · H⁺_l / H_l                 (terms with H_l = 0 are 0)

which is FastAP's formula with the squared distance 2 − 2s of unit vectors
(range [0, 4]) replaced by the similarity s (range [−1, 1] by default): the
two give the same value for cosine similarities. When every score sits on a
bin centre it is exact AP with ties counted pessimistically.

Similarities must lie in ``sim_range``; values up to 1% of the range outside
it (rounding of a cosine near ±1) are clamped to the end bins, anything
further raises ``ValueError`` rather than silently piling up in an end bin.

Cost. One pass bins the items (two ``scatter_add`` per histogram), the AP is
O(R · L), and the backward gathers each item's two bin gradients:
O(R · D) time and memory for R lists of D items — O(M) for the global loss
over M pairs, no P × M term. The histograms accumulate in float64 (a float32
bin holding millions of items would lose ~1e-4 relative accuracy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from rl_gap import dist as shard_comm
from rl_gap.losses.ap_surrogate import APSurrogateLoss
from rl_gap.losses.registry import register_loss
from rl_gap.losses.variant import variant_of
from rl_gap.precision import full_precision

RANGE_TOLERANCE = 0.01  # fraction of (hi − lo) a similarity may overshoot before it is an error
MAX_BINS = 1 << 15
ITEM_CHUNK = 1 << 18  # items binned per step (float64 weights of one chunk at a time)


def fastap_from_histograms(
    hist: torch.Tensor, hist_pos: torch.Tensor, num_pos: torch.Tensor
) -> torch.Tensor:
    """``(1/|P|) Σ_l h⁺_l H⁺_l / H_l`` per row of (R, L) histograms (bins ordered best first)."""
    cum_all = hist.cumsum(1)
    cum_pos = hist_pos.cumsum(1)
    terms = hist_pos * cum_pos / cum_all.clamp_min(torch.finfo(hist.dtype).tiny)
    terms = torch.where(cum_all > 0, terms, torch.zeros_like(terms))
    return terms.sum(1) / num_pos


def _bin_items(
    scores: torch.Tensor, num_centres: int, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lower bin index (int64) and the fraction of mass in the next bin, per item.

    ``num_centres`` is the number of bin centres, ``num_bins + 1``.
    """
    width = (high - low) / (num_centres - 1)
    position = (high - scores.clamp(low, high)) / width  # in [0, num_centres − 1]
    lower = position.floor().clamp_(min=0, max=num_centres - 2)
    return lower.long(), (position - lower).clamp_(0.0, 1.0)


def _chunks(num_items: int, width: int, num_centres: int, device: torch.device):
    """Item slices of the flattened (R, D) list and each item's row offset ``row · L``."""
    for start in range(0, num_items, ITEM_CHUNK):
        part = slice(start, min(start + ITEM_CHUNK, num_items))
        offset = torch.arange(part.start, part.stop, device=device).div_(
            width, rounding_mode="floor"
        )
        yield part, offset.mul_(num_centres)


class _SoftBinAP(torch.autograd.Function):
    """Items are binned in chunks of ITEM_CHUNK (float64 weights only per chunk);
    the state kept for backward is an int16 bin index and a bool mask per item."""

    @staticmethod
    def forward(ctx, scores, positive, valid, num_centres, low, high):  # type: ignore[override]
        num_rows, width = scores.shape
        flat = scores.detach().reshape(-1)
        flat_valid, flat_pos = valid.reshape(-1), positive.reshape(-1)
        # Two stacked histograms, non-positives then positives: one index_add per side.
        stride = num_rows * num_centres
        both = flat.new_zeros(2 * stride, dtype=torch.float64)
        with_grad = ctx.needs_input_grad[0]
        # The bin index fits in int16 (centres ≤ 2^15 + 1): a quarter of an int64 index.
        lower_all = torch.empty(flat.numel(), dtype=torch.int16, device=flat.device)
        inside_all = torch.empty_like(flat_valid) if with_grad else None
        for part, offset in _chunks(flat.numel(), width, num_centres, flat.device):
            s, ok = flat[part], flat_valid[part]
            lower, frac = _bin_items(s, num_centres, low, high)
            lower_all[part] = lower
            if with_grad:
                inside_all[part] = (s >= low) & (s <= high) & ok
            index = lower.add_(offset).add_(flat_pos[part] * stride)
            upper_w = frac.double().mul_(ok)
            lower_w = ok.double().sub_(upper_w)
            both.index_add_(0, index, lower_w).index_add_(0, index.add_(1), upper_w)
        hist_pos = both[stride:].view(num_rows, num_centres)
        hist = both[:stride].view(num_rows, num_centres) + hist_pos
        num_pos = positive.sum(1).double()
        ap = fastap_from_histograms(hist, hist_pos, num_pos)
        if with_grad:
            ctx.save_for_backward(lower_all, inside_all, flat_pos, hist, hist_pos, num_pos)
            ctx.inv_width = (num_centres - 1) / (high - low)
            ctx.shape = scores.shape
            ctx.input_dtype = scores.dtype
        return ap.to(scores.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    @full_precision
    def backward(ctx, grad_output):  # type: ignore[override]
        lower_all, inside_all, flat_pos, hist, hist_pos, num_pos = ctx.saved_tensors
        with torch.enable_grad():
            h = hist.detach().requires_grad_(True)
            hp = hist_pos.detach().requires_grad_(True)
            ap = fastap_from_histograms(h, hp, num_pos)
            grad_h, grad_hp = torch.autograd.grad(ap, (h, hp), grad_output.double())
        # ∂AP/∂(weight in bin l) is grad_h[l] for any item, + grad_hp[l] for a positive.
        table = torch.cat([grad_h.reshape(-1), (grad_h + grad_hp).reshape(-1)])
        stride = grad_h.numel()
        num_centres = hist.shape[1]
        grad = torch.empty(lower_all.numel(), dtype=ctx.input_dtype, device=hist.device)
        for part, offset in _chunks(lower_all.numel(), ctx.shape[1], num_centres, hist.device):
            index = lower_all[part].long().add_(offset).add_(flat_pos[part] * stride)
            at_lower = table.take(index)
            at_upper = table.take(index.add_(1))
            # ∂(lower weight)/∂s = +1/Δ, ∂(upper weight)/∂s = −1/Δ inside the range.
            grad[part] = at_lower.sub_(at_upper).mul_(inside_all[part]).mul_(ctx.inv_width)
        return grad.view(ctx.shape), None, None, None, None, None


def softbin_ap(
    scores: torch.Tensor,
    positive: torch.Tensor,
    valid: torch.Tensor,
    num_bins: int = 10,
    sim_range: Sequence[float] = (-1.0, 1.0),
) -> torch.Tensor:
    """SoftBin (FastAP) surrogate AP of every row of ``scores``, each row one list.

    Args:
        scores: (R, D) float scores (clamped to ``sim_range``; no range check here).
        positive: (R, D) bool relevant items, each row with ≥ 1 (and ⊆ ``valid``).
        valid: (R, D) bool, the items of each row's list.
        num_bins: L ≥ 1 intervals of ``sim_range`` (L + 1 bin centres, as FastAP).
        sim_range: (lo, hi) similarity range of the grid.

    Returns:
        (R,) SoftBin AP per row in ``scores.dtype``, differentiable w.r.t. ``scores``.
        Extra memory 3 bytes per item kept for backward (an int16 bin index and a
        bool mask), O(R · L) histograms and chunk-sized temporaries.
    """
    low, high = check_sim_range(sim_range)
    # FastAP's num_bins counts intervals; the kernel works on the num_bins + 1 centres.
    centres = check_num_bins(num_bins) + 1
    return _SoftBinAP.apply(scores, positive, valid, centres, low, high)


def check_num_bins(num_bins: int) -> int:
    if isinstance(num_bins, bool) or int(num_bins) != num_bins or not 1 <= num_bins <= MAX_BINS:
        raise ValueError(
            f"num_bins (intervals of sim_range, as FastAP) must be an integer in "
            f"[1, {MAX_BINS}], got {num_bins!r}"
        )
    return int(num_bins)


def check_sim_range(sim_range: Sequence[float]) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in sim_range)
    except (TypeError, ValueError):
        raise ValueError(f"sim_range must be two numbers (lo, hi), got {sim_range!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"sim_range must be finite with lo < hi, got {sim_range!r}")
    return low, high


# The sharded form: both histograms all-reduced over ranks, O(L) values.
class _ShardedSoftBinAP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, positive, num_bins, low, high):  # type: ignore[override]
        # num_bins here: the number of bin centres (FastAP num_bins + 1)
        flat = scores.detach()
        both = flat.new_zeros(2 * num_bins, dtype=torch.float64)
        lower_all = torch.empty(flat.numel(), dtype=torch.int16, device=flat.device)
        for start in range(0, flat.numel(), ITEM_CHUNK):
            part = slice(start, min(start + ITEM_CHUNK, flat.numel()))
            lower, frac = _bin_items(flat[part], num_bins, low, high)
            lower_all[part] = lower
            index = lower.add_(positive[part] * num_bins)
            upper_w = frac.double()
            both.index_add_(0, index, 1.0 - upper_w).index_add_(0, index.add_(1), upper_w)
        num_pos = torch.tensor(
            [float(torch.count_nonzero(positive))], dtype=torch.float64, device=flat.device
        )
        packed = shard_comm.all_reduce(torch.cat([both, num_pos]))
        hist_pos = packed[num_bins : 2 * num_bins][None]
        hist = packed[:num_bins][None] + hist_pos
        num_pos = packed[-1:]
        ap = fastap_from_histograms(hist, hist_pos, num_pos)[0]
        ctx.save_for_backward(lower_all, positive, (flat >= low) & (flat <= high), hist, hist_pos)
        ctx.num_pos, ctx.input_dtype = num_pos, scores.dtype
        ctx.inv_width = (num_bins - 1) / (high - low)
        return ap.to(scores.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):  # type: ignore[override]
        lower_all, positive, inside, hist, hist_pos = ctx.saved_tensors
        with torch.enable_grad():
            h = hist.detach().requires_grad_(True)
            hp = hist_pos.detach().requires_grad_(True)
            ap = fastap_from_histograms(h, hp, ctx.num_pos)[0]
            grad_h, grad_hp = torch.autograd.grad(ap, (h, hp), grad_output.double())
        table = torch.cat([grad_h.reshape(-1), (grad_h + grad_hp).reshape(-1)])
        num_bins = hist.shape[1]
        index = lower_all.long() + positive * num_bins
        grad = (table.take(index) - table.take(index + 1)) * inside * ctx.inv_width
        return grad.to(ctx.input_dtype), None, None, None, None


def sharded_softbin_ap(scores, positive, num_bins, sim_range) -> torch.Tensor:
    """SoftBin AP of the list concatenated over ranks ((n,) scores and positives per rank)."""
    low, high = (float(v) for v in sim_range)
    # num_bins counts FastAP's intervals; the histograms hold its num_bins + 1 centres.
    centres = check_num_bins(num_bins) + 1
    return _ShardedSoftBinAP.apply(scores, positive, centres, low, high)


@register_loss("softbin")
class SoftBinAPLoss(APSurrogateLoss):
    """Per-query SoftBin loss: ``1 − mean_{rows with a positive} SoftBinAP(row)``.

    Args:
        num_bins: L ≥ 1 intervals of ``sim_range``, i.e. L + 1 bin centres, as
            ``num_bins`` in FastAP's released code (its default 10).
        sim_range: (lo, hi) range of the similarities (cosine: (−1, 1)); values
            more than 1% of the range outside raise ``ValueError``.
        neg_drop: α in [0, 1), per-row negative dropping (``rl_gap/losses/common.py``).
        symmetric: also rank the columns and average both directions.

    Shapes: ``sim``, ``rel``, ``valid``: (Q, D) -> 0-d loss. Memory O(Q · D + Q · L).
    """

    def __init__(
        self,
        num_bins: int = 10,
        sim_range: Sequence[float] = (-1.0, 1.0),
        neg_drop: float = 0.0,
        symmetric: bool = False,
    ) -> None:
        super().__init__(neg_drop=neg_drop, symmetric=symmetric)
        self.num_bins = check_num_bins(num_bins)
        self.sim_range = check_sim_range(sim_range)

    list_kernel = staticmethod(softbin_ap)
    sharded_kernel = staticmethod(sharded_softbin_ap)

    def kernel_args(self) -> tuple[int, tuple[float, float]]:
        return self.num_bins, self.sim_range

    def settings(self) -> dict[str, Any]:
        return {"num_bins": self.num_bins, "sim_range": self.sim_range}

    def check_scores(self, sim: torch.Tensor, valid: torch.Tensor) -> None:
        low, high = self.sim_range
        values = sim.detach().masked_fill(~valid, low)
        vmin, vmax = (float(v) for v in torch.aminmax(values))
        tol = RANGE_TOLERANCE * (high - low)
        if vmin < low - tol or vmax > high + tol:
            raise ValueError(
                f"{type(self).__name__} bins similarities over sim_range [{low}, {high}], but the "
                f"valid similarities span [{vmin:.4g}, {vmax:.4g}]; normalise the embeddings "
                f"(cosine similarity) or set sim_range"
            )


@register_loss("gsoftbin")
@variant_of(SoftBinAPLoss, drop=("symmetric",))
class GlobalSoftBinAPLoss(SoftBinAPLoss):
    """Global SoftBin loss: ``1 − SoftBinAP`` of the flattened valid pairs as one list.

    Two (L,) histograms over all M valid pairs: memory O(M) (an int16 bin index
    and masks per pair) + O(L), no P × M term.

    Args:
        num_bins: L ≥ 1 intervals of ``sim_range`` (L + 1 bin centres, as FastAP).
        sim_range: (lo, hi) range of the similarities.
        neg_drop: α in [0, 1), dropping over the flattened list.
    """

    global_ranking = True
