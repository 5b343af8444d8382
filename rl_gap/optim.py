"""Optimizers and learning-rate schedules built from recipe settings.

Optimizers register by name (``@register_optimizer("lars")``) like losses do. A
training module's settings (optimizer, lr, weight decay, schedule, ...) are one
:class:`OptimizerSettings`, checked once when it is made. Parameters with fewer than two dimensions (biases, norm scales, a loss's
logit scale/bias) get no weight decay, as in CLIP, MoCo v3 and timm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {}


def register_optimizer(name: str):
    def decorator(fn):
        _OPTIMIZERS[name.lower()] = fn
        return fn

    return decorator


def available_optimizers() -> list[str]:
    return sorted(_OPTIMIZERS)


@register_optimizer("adamw")
def _adamw(params, lr: float, weight_decay: float, betas=(0.9, 0.999), **_: Any):
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=tuple(betas))


@register_optimizer("sgd")
def _sgd(params, lr: float, weight_decay: float, momentum: float = 0.9, **_: Any):
    return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay, momentum=momentum)


class LARS(torch.optim.Optimizer):
    """Layer-wise adaptive rate scaling with momentum (You, Gitman & Ginsburg 2017).

    As MoCo v3 uses it for ResNets; registered as ``lars`` (``optimizer: lars`` in a recipe).
    For every parameter with ≥ 2 dimensions (weights, not biases or norm scales):
    ``g ← g + λ·w``, then ``g ← g · η‖w‖/‖g‖`` (trust ratio; 1 when either norm is
    0). Every parameter then takes heavy-ball momentum ``μ ← β·μ + g`` and
    ``w ← w − lr·μ``. Parameters with < 2 dimensions get neither weight decay nor
    the trust ratio (MoCo v3 / BYOL convention).

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


SCHEDULERS = ("cosine", "constant", "none")


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got the bool {value}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return number


class OptimizerSettingsError(ValueError):
    """An optimizer or schedule setting that would train to nonsense; the message names it."""


@dataclass(frozen=True)
class OptimizerSettings:
    """A training module's optimizer and learning-rate schedule, checked once, when made.

    Every ranking module (:class:`rl_gap.modules.base.RankingModule`) takes these as
    keyword arguments (``optimizer="sgd", lr=0.1, momentum=0.9``; a recipe's
    ``model.init_args``) and keeps them as one object, ``module.optimizer_settings``;
    a module may declare its own defaults for some (CLIP: ``lr=1e-5``). The defaults
    here are :data:`OPTIMIZER_DEFAULTS`.

    Attributes:
        optimizer: a registered optimizer name (``adamw``, ``sgd``, ``lars``).
        lr: peak learning rate.
        weight_decay: applied to parameters with ≥ 2 dimensions only.
        betas: AdamW betas.
        momentum: SGD/LARS momentum (MoCo v3's module names it ``momentum_sgd``: its
            ``momentum`` is the momentum encoder's coefficient).
        scheduler: ``cosine`` (linear warmup then cosine), ``constant`` or ``none``.
        warmup: warmup length in optimizer steps, or a fraction of all steps if < 1.
        min_lr_ratio: final LR of the cosine as a fraction of ``lr``.
        lr_scales: parameter-name prefix -> LR multiplier (e.g. a slower backbone).

    Raises:
        OptimizerSettingsError: an unknown optimizer or scheduler; ``lr`` not finite and
            > 0; ``weight_decay`` not finite and >= 0; ``betas`` not two numbers in [0, 1);
            ``momentum`` not in [0, 1); ``warmup`` negative, not finite, or >= 1 and not a
            whole number of steps; ``min_lr_ratio`` outside [0, 1]; an ``lr_scales`` value
            not finite and >= 0. Made when a module is built, so ``--model.lr nan`` fails
            before any data is loaded instead of training to chance and exiting 0.
    """

    optimizer: str = "adamw"
    lr: float = 1e-4
    weight_decay: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    momentum: float = 0.9
    scheduler: str = "cosine"
    warmup: float = 0.0
    min_lr_ratio: float = 0.0
    lr_scales: dict[str, float] | None = None

    def __post_init__(self) -> None:
        try:
            _check_settings(**{f.name: getattr(self, f.name) for f in fields(self)})
        except ValueError as err:
            raise OptimizerSettingsError(str(err)) from None
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        if self.lr_scales is not None:
            object.__setattr__(self, "lr_scales", dict(self.lr_scales))

    def optimizer_for(self, modules: Iterable[nn.Module]) -> torch.optim.Optimizer:
        """The optimizer over the modules' trainable parameters (see :func:`param_groups`)."""
        groups = param_groups(modules, self.weight_decay, self.lr_scales)
        return build_optimizer(
            self.optimizer, groups, lr=self.lr, weight_decay=self.weight_decay,
            betas=self.betas, momentum=self.momentum,
        )  # fmt: skip

    def scheduler_for(
        self, optimizer: torch.optim.Optimizer, total_steps: int
    ) -> torch.optim.lr_scheduler.LambdaLR | None:
        """The per-step learning-rate schedule over ``total_steps`` (None for ``none``)."""
        return build_scheduler(
            optimizer, self.scheduler, max(1, int(total_steps)), self.warmup, self.min_lr_ratio
        )


def _check_settings(
    optimizer: str,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    momentum: float,
    scheduler: str,
    warmup: float,
    min_lr_ratio: float,
    lr_scales: dict[str, float] | None,
) -> None:
    if str(optimizer).lower() not in _OPTIMIZERS:
        raise ValueError(
            f"unknown optimizer {optimizer!r}; known: {', '.join(available_optimizers())}"
        )
    if not _number("lr", lr) > 0:
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if not _number("weight_decay", weight_decay) >= 0:
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be two numbers (beta1, beta2), got {betas!r}")
    for i, beta in enumerate(betas):
        if not 0 <= _number(f"betas[{i}]", beta) < 1:
            raise ValueError(f"betas must lie in [0, 1), got {tuple(betas)!r}")
    if not 0 <= _number("momentum", momentum) < 1:
        raise ValueError(f"momentum (SGD/LARS) must lie in [0, 1), got {momentum!r}")
    if str(scheduler).lower() not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; known: {', '.join(SCHEDULERS)}")
    warm = _number("warmup", warmup)
    if warm < 0 or (warm >= 1 and warm != int(warm)):
        raise ValueError(
            f"warmup is a fraction of all steps in [0, 1) or a whole number of steps, got {warmup!r}"
        )
    if not 0 <= _number("min_lr_ratio", min_lr_ratio) <= 1:
        raise ValueError(f"min_lr_ratio must lie in [0, 1], got {min_lr_ratio!r}")
    for prefix, scale in (lr_scales or {}).items():
        if not _number(f"lr_scales[{prefix!r}]", scale) >= 0:
            raise ValueError(f"lr_scales[{prefix!r}] must be a finite number >= 0, got {scale!r}")


OPTIMIZER_DEFAULTS = OptimizerSettings()
"""The settings a module gets for every key it does not set (a module's own defaults aside)."""


def check_optimizer_settings(
    optimizer: str,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = OPTIMIZER_DEFAULTS.betas,
    momentum: float = OPTIMIZER_DEFAULTS.momentum,
    scheduler: str = OPTIMIZER_DEFAULTS.scheduler,
    warmup: float = OPTIMIZER_DEFAULTS.warmup,
    min_lr_ratio: float = OPTIMIZER_DEFAULTS.min_lr_ratio,
    lr_scales: dict[str, float] | None = None,
) -> OptimizerSettings:
    """The :class:`OptimizerSettings` of these values (raising its one-line error if bad)."""
    return OptimizerSettings(
        optimizer, lr, weight_decay, betas, momentum, scheduler, warmup, min_lr_ratio, lr_scales
    )


def param_groups(
    modules: Iterable[nn.Module], weight_decay: float, lr_scales: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    """Split trainable parameters into decayed (≥2-D) and non-decayed groups.

    ``lr_scales`` maps a parameter-name prefix to a learning-rate multiplier
    (e.g. ``{"loss_fn.": 1.0, "backbone.": 0.1}``); the longest prefix wins.
    """
    lr_scales = lr_scales or {}
    groups: dict[tuple[bool, float], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for module in modules:
        for name, p in module.named_parameters():
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            prefixes = [k for k in lr_scales if name.startswith(k)]
            scale = lr_scales[max(prefixes, key=len)] if prefixes else 1.0
            groups.setdefault((p.ndim >= 2, scale), []).append(p)
    return [
        {"params": ps, "weight_decay": weight_decay if decay else 0.0, "lr_scale": scale}
        for (decay, scale), ps in groups.items()
    ]


def build_optimizer(
    name: str, groups: list[dict[str, Any]], lr: float, weight_decay: float, **kwargs: Any
) -> torch.optim.Optimizer:
    key = name.lower()
    if key not in _OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(available_optimizers())}")
    for g in groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
        g.setdefault("initial_lr", g["lr"])
    return _OPTIMIZERS[key](groups, lr=lr, weight_decay=weight_decay, **kwargs)


def warmup_cosine_factor(
    step: int, total_steps: int, warmup_steps: int, min_factor: float
) -> float:
    """LR multiplier: linear warmup from ~0 to 1, then cosine decay to ``min_factor``."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if total_steps <= warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    kind: str,
    total_steps: int,
    warmup: float,
    min_lr_ratio: float,
) -> torch.optim.lr_scheduler.LambdaLR | None:
    """``kind`` in {"cosine", "constant", "none"}; ``warmup`` in steps, or a
    fraction of ``total_steps`` when below 1."""
    kind = kind.lower()
    if kind == "none":
        return None
    warmup_steps = int(round(warmup * total_steps)) if 0 < warmup < 1 else int(warmup)
    if kind == "cosine":

        def factor(step: int) -> float:
            return warmup_cosine_factor(step, total_steps, warmup_steps, min_lr_ratio)

    elif kind == "constant":

        def factor(step: int) -> float:
            return (step + 1) / warmup_steps if step < warmup_steps else 1.0

    else:
        raise ValueError(f"unknown scheduler {kind!r}; known: cosine, constant, none")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
