"""LARS (You, Gitman & Ginsburg 2017), as MoCo v3 uses it for ResNets.

Registered as ``lars`` in the optimizer registry (``optimizer: lars`` in a
recipe); importing :mod:`rl_gap.modules.moco_v3` registers it.

For every parameter with ≥ 2 dimensions (weights, not biases or norm scales):
``g ← g + λ·w``, then ``g ← g · η‖w‖/‖g‖`` (trust ratio; 1 when either norm is
0). Every parameter then takes heavy-ball momentum ``μ ← β·μ + g`` and
``w ← w − lr·μ``. Parameters with < 2 dimensions get neither weight decay nor
the trust ratio (MoCo v3 / BYOL convention).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from rl_gap.optim import register_optimizer


class LARS(torch.optim.Optimizer):
    """Layer-wise adaptive rate scaling with momentum.

    Args:
        params: parameters or parameter groups.
        lr: learning rate.
        weight_decay: λ, added to the gradient of ≥ 2-D parameters.
        momentum: β, heavy-ball momentum.
        trust_coefficient: η in the trust ratio η‖w‖/‖g‖ (MoCo v3: 0.001).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        weight_decay: float = 0.0,
        momentum: float = 0.9,
        trust_coefficient: float = 0.001,
    ) -> None:
        if lr < 0 or weight_decay < 0 or not 0 <= momentum < 1 or trust_coefficient <= 0:
            raise ValueError(
                f"invalid LARS settings lr={lr}, weight_decay={weight_decay}, "
                f"momentum={momentum}, trust_coefficient={trust_coefficient}"
            )
        defaults = dict(
            lr=lr, weight_decay=weight_decay, momentum=momentum, trust_coefficient=trust_coefficient
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = p.grad
                if p.ndim >= 2:
                    update = update.add(p, alpha=group["weight_decay"])
                    w_norm = torch.linalg.vector_norm(p)
                    u_norm = torch.linalg.vector_norm(update)
                    ratio = torch.where(
                        (w_norm > 0) & (u_norm > 0),
                        group["trust_coefficient"] * w_norm / u_norm,
                        torch.ones_like(w_norm),
                    )
                    update = update * ratio
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                buf.mul_(group["momentum"]).add_(update)
                p.add_(buf, alpha=-group["lr"])
        return loss


@register_optimizer("lars")
def _lars(
    params,
    lr: float,
    weight_decay: float,
    momentum: float = 0.9,
    trust_coefficient: float = 0.001,
    **_: Any,
) -> LARS:
    return LARS(
        params,
        lr=lr,
        weight_decay=weight_decay,
        momentum=momentum,
        trust_coefficient=trust_coefficient,
    )
