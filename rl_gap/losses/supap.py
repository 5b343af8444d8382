"""SupAP: the rank approximation of ROADMAP (Ramzi et al., NeurIPS 2021), per query and global.

For a positive k of a list with positives P and negatives N, the rank among
positives is exact and the negatives' rank uses a smooth upper bound of the
step, with t = s_j − s_k:

    rk⁺(k) = Σ_{j in P} H(s_j − s_k)        (exact step, H(0) = 1: ties count against k)
    rk⁻(k) = Σ_{j in N} H⁻(s_j − s_k)

    H⁻(t) = σ(t/τ)               t ≤ 0
            start + σ(t/τ)       0 < t ≤ δ
            ρ·t + offset         t > δ

    SupAP = (1/|P|) Σ_{k in P} rk⁺(k) / (rk⁺(k) + rk⁻(k))

The sigmoid keeps gradient for negatives ranked below a positive, the linear
part (slope ρ) keeps a non-vanishing gradient for every negative ranked above
it, and H⁻ ≥ H (for offset ≥ 1 and start ≥ 1/2) makes 1 − SupAP an upper
bound of 1 − AP. δ is the margin band; δ = 0 gives the two-piece form (sigmoid
below 0, ρ·t + offset above). Defaults τ = 0.01, ρ = 100, offset = 1.44,
δ = 0.05, start = 1/2 are the authors' released SupAP settings; their released
iNaturalist setting is start = 0, offset = 1 (``roadmap/config/loss/supap_inat.yaml``). Positives pass no gradient through
rk⁺ (a step); the gradient flows through the negatives' comparisons.

Cost and memory. Every (positive, negative) comparison of a list is
evaluated once, like gSAP's exact sweep: positives are processed in chunks
and the gradient is accumulated analytically during the forward pass, so the
peak extra memory is a few chunk × D blocks (D = list length; M for the
global loss) plus O(R · D) — never the P × M comparison matrix. Time is
O(P · D) per list: for the global loss, P · M over the whole batch.
"""

from __future__ import annotations

import torch

from rl_gap.losses.ap_surrogate import (
    APSurrogateLoss,
    check_chunk_size,
    pessimistic_ranks,
)
from rl_gap.losses.common import sweep_with_gradient
from rl_gap.losses.registry import register_loss
from rl_gap.losses.sharding.global_surrogates import sharded_supap
from rl_gap.losses.supap_flat import SupAPParams, supap_one_list
from rl_gap.losses.variant import variant_of

# Elements of one (chunk × D) block of the per-row sweep: 2^20 float32 = 4 MiB;
# the sweep holds about six such blocks at a time. (The global loss's one-list
# sweep, ``rl_gap/losses/supap_flat.py``, uses 2^22-element blocks.)
DEFAULT_BLOCK_ELEMENTS = 1 << 20


def h_minus(
    t: torch.Tensor, temperature: float, rho: float, offset: float, margin: float, start: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``H⁻(t)`` and its derivative (the sigmoid's left derivative at t = δ). Consumes ``t``."""
    inv_tau = 1.0 / temperature
    above = t > margin
    value = torch.sigmoid(t.clamp(max=margin) * inv_tau)
    deriv = value * (1.0 - value) * inv_tau
    if margin > 0:
        value += start * (t > 0)
    linear = t.mul_(rho).add_(offset)
    value = torch.where(above, linear, value)
    return value, deriv.masked_fill_(above, rho)


def _supap_sweep(
    scores: torch.Tensor,
    positive: torch.Tensor,
    negative: torch.Tensor,
    params: SupAPParams,
    chunk_size: int | None,
    with_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SupAP of every row and (optionally) ∂SupAP_r/∂scores[r, :] (R, D).

    Anchors (the positives of all rows, row-major) are processed in chunks;
    each chunk compares its anchors with the (masked) items of their rows. A
    one-row input (the global loss) goes to ``supap_one_list``, which sums the
    linear part of H⁻ exactly by sorting and needs about half the passes.
    """
    if scores.shape[0] == 1:
        ap, grad = supap_one_list(
            scores[0], positive[0], negative[0], params, chunk_size, with_grad
        )
        return ap[None], None if grad is None else grad[None]
    dtype = scores.dtype
    anchors = positive.nonzero()
    rows, cols = anchors[:, 0], anchors[:, 1]
    anchor_scores = scores[rows, cols]
    weight = 1.0 / positive.sum(1).to(dtype)[rows]  # 1/|P_r| of each anchor's row
    rank_pos = pessimistic_ranks(scores, positive)[rows, cols].to(dtype)
    chunk = chunk_size or max(1, DEFAULT_BLOCK_ELEMENTS // max(1, scores.shape[1]))
    ap = scores.new_zeros(scores.shape[0])
    grad = torch.zeros_like(scores) if with_grad else None
    grad_anchor = scores.new_zeros(rows.numel()) if with_grad else None
    for start in range(0, rows.numel(), chunk):
        part = slice(start, min(start + chunk, rows.numel()))
        r = rows[part]
        value, deriv = h_minus(scores[r] - anchor_scores[part, None], *params)
        outside = ~negative[r]
        value.masked_fill_(outside, 0.0)
        deriv.masked_fill_(outside, 0.0)
        rank_all = rank_pos[part] + value.sum(1)
        ap.index_add_(0, r, weight[part] * rank_pos[part] / rank_all)
        if not with_grad:
            continue
        coef = -weight[part] * rank_pos[part] / rank_all.square()  # ∂AP/∂rk⁻ per anchor
        grad_anchor[part] = -coef * deriv.sum(1)
        grad.index_add_(0, r, deriv.mul_(coef[:, None]))
    if not with_grad:
        return ap, None
    grad.index_put_((rows, cols), grad_anchor, accumulate=True)
    return ap, grad


def supap(
    scores: torch.Tensor,
    positive: torch.Tensor,
    valid: torch.Tensor,
    params: SupAPParams,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """SupAP of every row of ``scores``, each row one list.

    Args:
        scores: (R, D) float scores.
        positive: (R, D) bool relevant items, each row with ≥ 1 (and ⊆ ``valid``).
        valid: (R, D) bool, the items of each row's list.
        params: τ > 0 of the sigmoid part of H⁻; ρ ≥ 0, its slope above the margin;
            offset, its value where the linear part starts (≥ 1 keeps the upper bound);
            δ ≥ 0, width of the band (0, δ] where H⁻ = start + σ(t/τ); start ≥ 0, H⁻'s step
            at t = 0 inside the band (1/2: released default; 0: released iNaturalist setting).
        chunk_size: positives per chunk; None keeps a chunk × D block near 2^20 elements
            (2^22 for a one-row input).

    Returns:
        (R,) SupAP per row, differentiable w.r.t. ``scores`` (first order).
    """
    params = SupAPParams.checked(*params)
    negative = valid & ~positive
    chunk_size = check_chunk_size(chunk_size)
    return sweep_with_gradient(_supap_sweep, scores, positive, negative, params, chunk_size)


@register_loss("supap")
class SupAPLoss(APSurrogateLoss):
    """Per-query SupAP (ROADMAP's AP term): ``1 − mean_{rows with a positive} SupAP(row)``.

    Args:
        temperature: τ > 0 of the sigmoid part (default 0.01).
        rho: ρ ≥ 0, slope above the margin (default 100).
        offset: value where the linear part starts (default 1.44).
        margin: δ ≥ 0 of the band (0, δ] (default 0.05).
        start: ≥ 0, H⁻'s step at t = 0 inside the band (default 0.5; ROADMAP's released
            iNaturalist setting: start 0 with offset 1).
        neg_drop: α in [0, 1), per-row negative dropping.
        symmetric: also rank the columns and average both directions.
        chunk_size: positives per chunk; None = automatic.

    Shapes: ``sim``, ``rel``, ``valid``: (Q, D) -> 0-d loss. Extra memory a few
    chunk × D blocks + O(Q · D); time O(P · D), P the valid positive pairs.
    """

    def __init__(
        self,
        temperature: float = 0.01,
        rho: float = 100.0,
        offset: float = 1.44,
        margin: float = 0.05,
        neg_drop: float = 0.0,
        symmetric: bool = False,
        chunk_size: int | None = None,
        start: float = 0.5,
    ) -> None:
        super().__init__(neg_drop=neg_drop, symmetric=symmetric)
        checked = SupAPParams.checked(temperature, rho, offset, margin, start)
        self.temperature, self.rho, self.offset, self.margin, self.start = checked
        self.chunk_size = check_chunk_size(chunk_size)

    list_kernel = staticmethod(supap)
    sharded_kernel = staticmethod(sharded_supap)

    def kernel_args(self) -> tuple[SupAPParams, int | None]:
        return self.params, self.chunk_size

    def settings(self) -> dict[str, float]:
        return self.params._asdict()

    @property
    def params(self) -> SupAPParams:
        """The settings of H⁻ the kernels take."""
        return SupAPParams(self.temperature, self.rho, self.offset, self.margin, self.start)


@register_loss("gsupap")
@variant_of(SupAPLoss, drop=("symmetric",))
class GlobalSupAPLoss(SupAPLoss):
    """Global SupAP over the flattened valid pairs as one list.

    Peak extra memory a few chunk × M blocks (M valid pairs; one positive per
    chunk by default at M ≥ 2^22) + O(M): no P × M matrix. Time O(P · M).

    Args:
        temperature, rho, offset, margin, start: as :class:`SupAPLoss`.
        neg_drop: α in [0, 1), dropping over the flattened list.
        chunk_size: positives per chunk; None = automatic.
    """

    global_ranking = True
