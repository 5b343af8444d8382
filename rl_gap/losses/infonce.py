"""Multi-positive InfoNCE (Oord et al. 2018; CLIP, Radford et al. 2021).

Per row q: ``−mean_{p in P_q} log softmax(scale · sim_q)_p`` over the row's
valid pairs; the loss averages rows with ≥ 1 valid positive, and
``symmetric=True`` averages the row and column directions. With
``rel = eye`` and ``symmetric=True`` it is CLIP's loss.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rl_gap import dist as shard_comm
from rl_gap.losses.base import RankingLoss
from rl_gap.losses.common import (
    check_temperature,
    compute_dtype,
)
from rl_gap.losses.registry import register_loss
from rl_gap.losses.sharding.rows import mean_over_ranks


def multi_positive_infonce_rows(
    logits: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """Mean over rows with ≥ 1 valid positive of ``−mean_{p} log softmax(row)_p`` (0-d).

    Args:
        logits: (Q, D) scaled similarities.
        rel: (Q, D) bool relevance.
        valid: (Q, D) bool, False = pair excluded from the softmax.
    """
    # The dtype minimum rather than −inf: a row with no valid pair then has a
    # finite (uniform) softmax and no NaN can leak into the backward pass.
    masked = logits.masked_fill(~valid, torch.finfo(logits.dtype).min)
    log_prob = torch.log_softmax(masked, dim=1)
    positive = rel & valid
    num_pos = positive.sum(1)
    per_row = -log_prob.masked_fill(~positive, 0.0).sum(1) / num_pos.clamp(min=1)
    return per_row[num_pos > 0].mean()


def infonce_row_partial(
    logits: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """(sum over this rank's rows with a positive of the row loss, that row count)."""
    masked = logits.masked_fill(~valid, torch.finfo(logits.dtype).min)
    log_prob = torch.log_softmax(masked, dim=1)
    positive = rel & valid
    num_pos = positive.sum(1)
    per_row = -log_prob.masked_fill(~positive, 0.0).sum(1) / num_pos.clamp(min=1)
    return per_row[num_pos > 0].sum(), int(torch.count_nonzero(num_pos))


def infonce_column_partial(
    logits: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """This rank's partial of the column-direction loss over rows sharded across ranks.

    Column c's loss is ``LSE_c − mean_{q in P_c} logit_qc`` with the
    log-sum-exp over every rank's rows: its (M,) max (no gradient, LSE is
    shift-invariant) and sum of exponentials are all-reduced. The LSE terms are
    the same on every rank and enter rank 0's partial only. Returns the partial
    and the global number of columns with a positive.
    """
    finfo_min = torch.finfo(logits.dtype).min
    masked = logits.masked_fill(~valid, finfo_min)
    col_max = shard_comm.all_reduce(masked.detach().amax(0).contiguous(), "max")
    sum_exp = shard_comm.reduce_statistic(torch.exp(masked - col_max).sum(0))
    lse = sum_exp.log() + col_max
    positive = rel & valid
    pos_count = shard_comm.all_reduce(positive.sum(0).to(torch.int64))
    has_pos = pos_count > 0
    num_cols = int(torch.count_nonzero(has_pos))
    pos_sum = logits.masked_fill(~positive, 0.0).sum(0)
    local = -(pos_sum / pos_count.clamp(min=1).to(logits.dtype))[has_pos].sum()
    return local + shard_comm.first_rank_only(lse[has_pos].sum()), num_cols


@register_loss("infonce")
class InfoNCELoss(RankingLoss):
    """InfoNCE with a fixed temperature or a learnable CLIP-style logit scale.

    Args:
        temperature: τ > 0; logits are ``sim / τ``. With ``learnable_scale``
            it sets the initial scale 1/τ (default 0.07: CLIP's init).
        symmetric: average the row (q -> d) and column (d -> q) losses
            (cross-modal / CLIP).
        learnable_scale: learn ``log(scale)`` (a parameter of this module);
            the scale is clamped at ``max_scale``.
        max_scale: upper clamp of the learnable scale (CLIP: 100), finite; a
            learnable scale must start at or below it (1/τ ≤ max_scale).

    Shapes: ``sim``, ``rel``, ``valid``: (Q, D) -> 0-d loss.
    """

    def __init__(
        self,
        temperature: float = 0.07,
        symmetric: bool = False,
        learnable_scale: bool = False,
        max_scale: float = 100.0,
    ) -> None:
        super().__init__()
        self.temperature = check_temperature(temperature)
        self.symmetric = bool(symmetric)
        self.learnable_scale = bool(learnable_scale)
        if not (float(max_scale) > 0 and math.isfinite(float(max_scale))):
            raise ValueError(f"infonce max_scale must be a finite number > 0, got {max_scale}")
        self.max_scale = float(max_scale)
        if self.learnable_scale and 1.0 / self.temperature > self.max_scale * (1 + 1e-9):
            # The clamp would hold the scale at max_scale with zero gradient: never learnt.
            raise ValueError(
                f"infonce learnable_scale starts at 1/temperature = {1.0 / self.temperature:.4g}, "
                f"above max_scale = {self.max_scale:.4g}, where the clamp leaves it no gradient; "
                f"raise temperature or max_scale"
            )
        if self.learnable_scale:
            self.log_logit_scale = nn.Parameter(torch.tensor(math.log(1.0 / self.temperature)))
        else:
            self.register_parameter("log_logit_scale", None)

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, symmetric={self.symmetric}, "
            f"learnable_scale={self.learnable_scale}"
        )

    def logit_scale(self) -> torch.Tensor | float:
        """Current multiplier of the similarities (1/τ)."""
        if self.log_logit_scale is None:
            return 1.0 / self.temperature
        return self.log_logit_scale.clamp(max=math.log(self.max_scale)).exp()

    def extra_logs(self) -> dict[str, float]:
        scale = (
            float(self.logit_scale().detach()) if self.learnable_scale else 1.0 / self.temperature
        )
        return {"logit_scale": scale, "temperature": 1.0 / scale}

    def _loss(self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        scale = self.logit_scale()
        logits = sim.to(compute_dtype(sim.dtype)) * scale
        loss = multi_positive_infonce_rows(logits, rel, valid)
        if self.symmetric:
            loss = 0.5 * (loss + multi_positive_infonce_rows(logits.T, rel.T, valid.T))
        return loss

    def _loss_sharded(
        self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """Rows: partial sums (scalars); columns: an all-reduced (M,) log-sum-exp."""
        logits = sim.to(compute_dtype(sim.dtype)) * self.logit_scale()
        row_sum, local_rows = infonce_row_partial(logits, rel, valid)
        loss = mean_over_ranks(row_sum, shard_comm.global_count(local_rows, sim.device))
        if self.symmetric:
            col_partial, num_cols = infonce_column_partial(logits, rel, valid)
            loss = 0.5 * (loss + mean_over_ranks(col_partial, num_cols))
        return loss
