"""Ranking losses over a batch similarity matrix: ``loss_fn(sim, rel, valid=None)``.

Importing this package registers every loss (``gsap``, ``msap``, ``infonce``,
``siglip``, and the other AP surrogates ``softbin``/``gsoftbin``,
``blackbox``/``gblackbox``, ``supap``/``gsupap``, and ROADMAP = SupAP + calibration,
``roadmap``/``groadmap``); a new loss module only needs
``@register_loss`` and an import here (docs/losses.md, "Add a loss").
"""

from rl_gap.losses import (  # noqa: F401  (registration)
    blackbox_ap,
    gsap,
    infonce,
    msap,
    roadmap,
    siglip,
    softbin,
    supap,
)
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
