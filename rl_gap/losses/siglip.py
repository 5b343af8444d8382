"""SigLIP: pairwise sigmoid loss (Zhai et al., *Sigmoid Loss for Language Image
Pre-Training*, ICCV 2023).

``−(1/Q) · sum_{valid (q, d)} log σ(z_qd · (t · s_qd + b))`` with ``z = +1``
for relevant pairs and −1 otherwise, ``t = exp(t')``; the learnable ``t'``
(init log 10) and bias ``b`` (init −10) live in this module. Normalised by the
number of rows Q as SigLIP (and open_clip's ``SigLipLoss``) does. The scale is
capped at ``max_scale`` (100, the cap open_clip's training loop puts on every
model's logit scale): a start above it is refused, a learnt one is clamped.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from rl_gap import dist as shard_comm
from rl_gap.losses.base import RankingLoss
from rl_gap.losses.common import compute_dtype
from rl_gap.losses.registry import register_loss
from rl_gap.losses.sharding.rows import mean_over_ranks


def sigmoid_pair_sum(logits: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``−Σ_valid log σ(±logits)`` (0-d); ``logits`` (Q, D) already scaled and biased."""
    sign = rel.to(logits.dtype) * 2.0 - 1.0
    return -(F.logsigmoid(sign * logits) * valid.to(logits.dtype)).sum()


def sigmoid_pair_loss(logits: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``−(1/Q) Σ_valid log σ(±logits)`` (0-d); ``logits`` (Q, D) already scaled and biased."""
    return sigmoid_pair_sum(logits, rel, valid) / logits.shape[0]


@register_loss("siglip")
class SigLIPLoss(RankingLoss):
    """SigLIP loss with a learnable scale t = exp(t') and bias b.

    A batch with no positive is still a well-defined SigLIP loss (every pair
    is pushed below the bias), so unlike the ranking losses it is computed,
    not replaced by 0.

    Args:
        init_log_scale: initial t' (SigLIP: log 10); ``exp(t')`` must not exceed
            ``max_scale`` (t' = 1000 would make every logit infinite).
        init_bias: initial b (SigLIP: −10), finite.
        learnable: learn t' and b (else fixed at their initial values).
        max_scale: upper clamp of the scale t = exp(t') (default 100), finite and > 0.

    Shapes: ``sim``, ``rel``, ``valid``: (Q, D) -> 0-d loss.
    """

    needs_positive = False  # every pair is a term: a positive-free batch still trains

    def __init__(
        self,
        init_log_scale: float = math.log(10.0),
        init_bias: float = -10.0,
        learnable: bool = True,
        max_scale: float = 100.0,
    ) -> None:
        super().__init__()
        init_log_scale, init_bias, max_scale = (
            float(init_log_scale),
            float(init_bias),
            float(max_scale),
        )
        if not (max_scale > 0 and math.isfinite(max_scale)):
            raise ValueError(f"siglip max_scale must be a finite number > 0, got {max_scale}")
        if not math.isfinite(init_log_scale) or init_log_scale > math.log(max_scale):
            raise ValueError(
                f"siglip init_log_scale is t' with scale t = exp(t'); it must be finite and "
                f"at most log(max_scale) = {math.log(max_scale):.4g}, got {init_log_scale} "
                f"(SigLIP's init is log 10 = 2.303)"
            )
        if not math.isfinite(init_bias):
            raise ValueError(f"siglip init_bias must be finite, got {init_bias}")
        self.max_scale = max_scale
        log_scale = torch.tensor(init_log_scale)
        bias = torch.tensor(init_bias)
        self.learnable = bool(learnable)
        if self.learnable:
            self.log_scale = nn.Parameter(log_scale)
            self.bias = nn.Parameter(bias)
        else:
            self.register_buffer("log_scale", log_scale)
            self.register_buffer("bias", bias)

    def scale(self) -> torch.Tensor:
        """t = exp(t'), clamped at ``max_scale`` (0-d, differentiable below the cap)."""
        return self.log_scale.clamp(max=math.log(self.max_scale)).exp()

    def extra_logs(self) -> dict[str, float]:
        return {
            "logit_scale": float(self.scale().detach()),
            "logit_bias": float(self.bias.detach()),
        }

    def _logits(self, sim: torch.Tensor) -> torch.Tensor:
        dtype = compute_dtype(sim.dtype)
        return sim.to(dtype) * self.scale().to(dtype) + self.bias.to(dtype)

    def _loss(self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        return sigmoid_pair_loss(self._logits(sim), rel, valid)

    def _loss_sharded(
        self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """Every pair is its own term: this rank's sum, over the global number of rows."""
        rows = shard_comm.global_count(sim.shape[0], sim.device)
        return mean_over_ranks(sigmoid_pair_sum(self._logits(sim), rel, valid), rows)
