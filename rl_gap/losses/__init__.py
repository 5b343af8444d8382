"""Ranking losses over a batch similarity matrix: ``loss_fn(sim, rel, valid=None)``.

Importing this package registers every loss (``gsap``, ``msap``, ``infonce``,
``siglip``, and the other AP surrogates ``softbin``/``gsoftbin``,
``blackbox``/``gblackbox``, ``supap``/``gsupap``, and ROADMAP = SupAP + calibration,
``roadmap``/``groadmap``). Every module of this package is imported here, so a
new loss is one file with ``@register_loss`` (docs/losses.md, "Add a loss").
"""

import importlib
import pkgutil

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

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.ispkg):
    importlib.import_module(f"{__name__}.{_module}")  # registers the losses it defines
del _module

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
