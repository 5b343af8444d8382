"""Encoders: timm backbone + embedding head (metric learning), open_clip towers, MoCo parts.

Names load on first use (:mod:`rl_gap.lazy`): importing the package costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl_gap.lazy import by_module, lazy_exports

_EXPORTS = by_module(
    {
        ".encoder": (
            "EmbeddingEncoder",
            "SmallConvNet",
            "load_backbone_weights",
            "create_backbone",
        ),
        ".clip": ("CLIPEncoder",),
        ".pretrained": ("PretrainedWeightsUnavailable", "weights_from_checkpoint"),
    }
)
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # the same names, for type checkers (__all__ is built above)
    from rl_gap.models.clip import CLIPEncoder
    from rl_gap.models.encoder import (
        EmbeddingEncoder,
        SmallConvNet,
        create_backbone,
        load_backbone_weights,
    )
    from rl_gap.models.pretrained import PretrainedWeightsUnavailable, weights_from_checkpoint
