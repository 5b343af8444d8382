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

from rl_gap.losses.common import check_batch, check_temperature, compute_dtype, zero_loss
from rl_gap.losses.registry import register_loss


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


@register_loss("infonce")
class InfoNCELoss(nn.Module):
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

    def forward(
        self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor | None = None
    ) -> torch.Tensor:
        sim, rel, valid = check_batch(sim, rel, valid)
        if not bool((rel & valid).any()):
            return zero_loss(sim, self, "batch has no valid positive pair")
        scale = self.logit_scale()
        logits = sim.to(compute_dtype(sim.dtype)) * scale
        loss = multi_positive_infonce_rows(logits, rel, valid)
        if self.symmetric:
            loss = 0.5 * (loss + multi_positive_infonce_rows(logits.T, rel.T, valid.T))
        return loss
