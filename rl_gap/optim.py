"""Optimizers and learning-rate schedules built from recipe settings.

Optimizers register by name (``@register_optimizer("lars")``) like losses do.
Parameters with fewer than two dimensions (biases, norm scales, a loss's
logit scale/bias) get no weight decay, as in CLIP, MoCo v3 and timm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
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
