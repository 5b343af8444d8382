"""BlackBox AP: AP from true ranks with blackbox-differentiated ranking, per query and global.

Rolínek et al., *Optimizing Rank-based Metrics with Blackbox Differentiation*
(CVPR 2020), using the combinatorial-solver gradient of Vlastelica et al.
(ICLR 2020). The forward pass is exact: for a list of n items with positives
P, the normalised rank ``r̃_i = rk_i / n`` with ``rk_i = |{j : s_j ≥ s_i}|``
(ties counted against i), the rank among positives ``rk⁺_i = |{j ∈ P : s_j ≥ s_i}|``
and

    AP = (1/|P|) Σ_{i in P} rk⁺_i / rk_i

(exact AP, ties pessimistic, when ``margin = 0``). The ranking r̃(s) is
piecewise constant; its backward pass is the blackbox rule: given the upstream
gradient g = ∂L/∂r̃,

    s' = s + λ · g,      ∂L/∂s := −(r̃(s) − r̃(s')) / λ

i.e. the loss is linearly interpolated between the ranking of s and that of
the perturbed input (λ > 0 sets the interpolation range; ranks are normalised
by the list length so λ does not scale with it). Only the rank among all
items is differentiated; ``rk⁺`` (the order among positives) is a constant.

``margin`` α ≥ 0 ranks every positive as if its score were α lower (the paper's
margin: a positive keeps receiving gradient until it leads its negatives by α);
the loss then reports the AP of the shifted scores. Here the shift is
deterministic (the same α for every positive).

Cost: two sorts of each list in the forward pass (all items; positives) and
one in the backward pass, O(R · D log D) time and O(R · D) memory for R lists
of D items — O(M log M) time and O(M) memory for the global loss over M pairs.
"""

from __future__ import annotations

import torch

from rl_gap.losses.ap_surrogate import APSurrogateLoss, check_positive_finite, pessimistic_ranks
from rl_gap.losses.registry import register_loss
from rl_gap.losses.sharding.global_surrogates import sharded_blackbox_ap
from rl_gap.losses.variant import variant_of
from rl_gap.precision import full_precision


class _BlackboxRank(torch.autograd.Function):
    """Normalised pessimistic ranks ``rk / n`` per row; blackbox backward."""

    @staticmethod
    def forward(ctx, scores, member, lambda_val):  # type: ignore[override]
        work = scores.detach()
        count = member.sum(1, keepdim=True).clamp(min=1).to(work.dtype)
        ranks = pessimistic_ranks(work, member).to(work.dtype) / count
        ranks = ranks.masked_fill_(~member, 1.0)  # non-members: a harmless placeholder
        ctx.save_for_backward(work, member, ranks, count)
        ctx.lambda_val = lambda_val
        return ranks

    @staticmethod
    @torch.autograd.function.once_differentiable
    @full_precision
    def backward(ctx, grad_output):  # type: ignore[override]
        work, member, ranks, count = ctx.saved_tensors
        lam = ctx.lambda_val
        perturbed = work + lam * grad_output.to(work.dtype).masked_fill(~member, 0.0)
        ranks_prime = pessimistic_ranks(perturbed, member).to(work.dtype) / count
        grad = (ranks_prime - ranks) / lam  # = −(r̃(s) − r̃(s')) / λ
        return grad.masked_fill_(~member, 0.0).to(grad_output.dtype), None, None


def blackbox_rank(scores: torch.Tensor, member: torch.Tensor, lambda_val: float) -> torch.Tensor:
    """Normalised ranks ``rk/n`` (ties pessimistic) of each row's member items, blackbox backward.

    Args:
        scores: (R, D) float scores.
        member: (R, D) bool, the items of each row's list (n = members per row).
        lambda_val: λ > 0, the blackbox interpolation strength.

    Returns:
        (R, D) ranks in (0, 1] (1.0 at non-members); backward
        ``−(r̃(s) − r̃(s + λ·g)) / λ`` at members, 0 elsewhere.
    """
    return _BlackboxRank.apply(scores, member, float(lambda_val))


def blackbox_ap(
    scores: torch.Tensor,
    positive: torch.Tensor,
    valid: torch.Tensor,
    lambda_val: float = 4.0,
    margin: float = 0.02,
) -> torch.Tensor:
    """BlackBox surrogate AP of every row, each row one list.

    Args:
        scores: (R, D) float scores.
        positive: (R, D) bool relevant items, each row with ≥ 1 (and ⊆ ``valid``).
        valid: (R, D) bool, the items of each row's list.
        lambda_val: λ > 0 of the blackbox backward.
        margin: α ≥ 0 subtracted from the positives' scores before ranking.

    Returns:
        (R,) AP of each row's (margin-shifted) ranking; its gradient is the
        blackbox gradient. Extra memory O(R · D).
    """
    shifted = scores - margin * positive.to(scores.dtype) if margin else scores
    ranks = blackbox_rank(shifted, valid, lambda_val)
    count = valid.sum(1, keepdim=True).to(scores.dtype)
    if scores.shape[0] == 1:  # one long list (global loss): sort only the positives
        rank_pos = torch.zeros_like(shifted)
        pos_scores = shifted[positive][None]
        rank_pos[positive] = pessimistic_ranks(
            pos_scores, torch.ones_like(pos_scores, dtype=torch.bool)
        )[0].to(scores.dtype)
    else:
        rank_pos = pessimistic_ranks(shifted, positive).to(scores.dtype)
    precision = torch.where(positive, rank_pos / (ranks * count), torch.zeros_like(ranks))
    return precision.sum(1) / positive.sum(1).to(scores.dtype)


@register_loss("blackbox")
class BlackBoxAPLoss(APSurrogateLoss):
    """Per-query BlackBox AP loss: ``1 − mean_{rows with a positive} AP(row)``.

    Args:
        lambda_val: λ > 0, blackbox interpolation strength (paper default 4).
        margin: α ≥ 0, positives ranked as if α lower (default 0.02).
        neg_drop: α_drop in [0, 1), per-row negative dropping.
        symmetric: also rank the columns and average both directions.

    Shapes: ``sim``, ``rel``, ``valid``: (Q, D) -> 0-d loss. Memory O(Q · D).
    The gradient is the blackbox one, so it scales with the upstream gradient
    (λ interpolates the *loss*, including any weight applied to it).
    """

    def __init__(
        self,
        lambda_val: float = 4.0,
        margin: float = 0.02,
        neg_drop: float = 0.0,
        symmetric: bool = False,
    ) -> None:
        super().__init__(neg_drop=neg_drop, symmetric=symmetric)
        self.lambda_val = check_positive_finite("lambda_val", lambda_val)
        self.margin = check_positive_finite("margin", margin, allow_zero=True)

    list_kernel = staticmethod(blackbox_ap)
    sharded_kernel = staticmethod(sharded_blackbox_ap)

    def kernel_args(self) -> tuple[float, float]:
        return self.lambda_val, self.margin

    def settings(self) -> dict[str, float]:
        return {"lambda_val": self.lambda_val, "margin": self.margin}


@register_loss("gblackbox")
@variant_of(BlackBoxAPLoss, drop=("symmetric",))
class GlobalBlackBoxAPLoss(BlackBoxAPLoss):
    """Global BlackBox AP loss over the flattened valid pairs as one list.

    Ranks of all M pairs by two sorts forward, one backward: O(M log M) time,
    O(M) memory, no P × M term.

    Args:
        lambda_val: λ > 0, blackbox interpolation strength.
        margin: α ≥ 0, positives ranked as if α lower.
        neg_drop: α_drop in [0, 1), dropping over the flattened list.
    """

    global_ranking = True
