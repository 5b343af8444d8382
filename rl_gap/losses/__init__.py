"""Ranking losses over a batch similarity matrix: ``loss_fn(sim, rel, valid=None)``.

Importing this package registers every loss (``gsap``, ``msap``, ``infonce``,
``siglip``); a new loss module only needs ``@register_loss`` and an import here.
"""

from rl_gap.losses import gsap, infonce, msap, siglip  # noqa: F401  (registration)
from rl_gap.losses.gsap import GlobalSmoothAPLoss
from rl_gap.losses.infonce import InfoNCELoss
from rl_gap.losses.msap import MeanSmoothAPLoss
from rl_gap.losses.registry import (
    available_losses,
    build_loss,
    get_loss_class,
    loss_from_config,
    register_loss,
)
from rl_gap.losses.siglip import SigLIPLoss
from rl_gap.losses.smoothed_ap import smoothed_ap_exact, smoothed_ap_rows

__all__ = [
    "GlobalSmoothAPLoss",
    "InfoNCELoss",
    "MeanSmoothAPLoss",
    "SigLIPLoss",
    "available_losses",
    "build_loss",
    "get_loss_class",
    "loss_from_config",
    "register_loss",
    "smoothed_ap_exact",
    "smoothed_ap_rows",
]
