"""SigLIP: pairwise sigmoid loss (Zhai et al., *Sigmoid Loss for Language Image
Pre-Training*, ICCV 2023).

``−(1/Q) · sum_{valid (q, d)} log σ(z_qd · (t · s_qd + b))`` with ``z = +1``
for relevant pairs and −1 otherwise, ``t = exp(t')``; the learnable ``t'``
(init log 10) and bias ``b`` (init −10) live in this module. Normalised by the
number of rows Q as SigLIP (and open_clip's ``SigLipLoss``) does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from rl_gap.losses.common import check_batch, compute_dtype
from rl_gap.losses.registry import register_loss


def sigmoid_pair_loss(logits: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``−(1/Q) Σ_valid log σ(±logits)`` (0-d); ``logits`` (Q, D) already scaled and biased."""
    sign = rel.to(logits.dtype) * 2.0 - 1.0
    per_pair = F.logsigmoid(sign * logits) * valid.to(logits.dtype)
    return -per_pair.sum() / logits.shape[0]


@register_loss("siglip")
class SigLIPLoss(nn.Module):
    """SigLIP loss with a learnable scale t = exp(t') and bias b.

    A batch with no positive is still a well-defined SigLIP loss (every pair
    is pushed below the bias), so unlike the ranking losses it is computed,
    not replaced by 0.

    Args:
        init_log_scale: initial t' (SigLIP: log 10).
        init_bias: initial b (SigLIP: −10).
        learnable: learn t' and b (else fixed at their initial values).

    Shapes: ``sim``, ``rel``, ``valid``: (Q, D) -> 0-d loss.
    """

    def __init__(
        self,
        init_log_scale: float = math.log(10.0),
        init_bias: float = -10.0,
        learnable: bool = True,
    ) -> None:
        super().__init__()
        log_scale = torch.tensor(float(init_log_scale))
        bias = torch.tensor(float(init_bias))
        if not (math.isfinite(float(init_log_scale)) and math.isfinite(float(init_bias))):
            raise ValueError(
                f"init_log_scale and init_bias must be finite, got {init_log_scale}, {init_bias}"
            )
        self.learnable = bool(learnable)
        if self.learnable:
            self.log_scale = nn.Parameter(log_scale)
            self.bias = nn.Parameter(bias)
        else:
            self.register_buffer("log_scale", log_scale)
            self.register_buffer("bias", bias)

    def extra_logs(self) -> dict[str, float]:
        return {
            "logit_scale": float(self.log_scale.detach().exp()),
            "logit_bias": float(self.bias.detach()),
        }

    def forward(
        self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor | None = None
    ) -> torch.Tensor:
        sim, rel, valid = check_batch(sim, rel, valid)
        dtype = compute_dtype(sim.dtype)
        logits = sim.to(dtype) * self.log_scale.to(dtype).exp() + self.bias.to(dtype)
        return sigmoid_pair_loss(logits, rel, valid)
