"""Ranking losses over a batch similarity matrix: ``loss_fn(sim, rel, valid=None)``."""

from rl_gap.losses.registry import (
    available_losses,
    build_loss,
    get_loss_class,
    loss_from_config,
    register_loss,
)

__all__ = [
    "available_losses",
    "build_loss",
    "get_loss_class",
    "loss_from_config",
    "register_loss",
]
