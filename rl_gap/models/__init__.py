"""Encoders: timm backbone + embedding head (metric learning), open_clip towers, MoCo parts.

Names load on first use (:mod:`rl_gap.lazy`): importing the package costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl_gap.lazy import lazy_exports

_EXPORTS = {
    "EmbeddingEncoder": ".encoder",
    "SmallConvNet": ".encoder",
    "load_backbone_weights": ".encoder",
    "create_backbone": ".encoder",
    "CLIPEncoder": ".clip",
    "PretrainedWeightsUnavailable": ".pretrained",
    "weights_from_checkpoint": ".pretrained",
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
__all__ = [
    "CLIPEncoder",
    "EmbeddingEncoder",
    "PretrainedWeightsUnavailable",
    "SmallConvNet",
    "create_backbone",
    "load_backbone_weights",
    "weights_from_checkpoint",
]

if TYPE_CHECKING:
    from rl_gap.models.clip import CLIPEncoder
    from rl_gap.models.encoder import (
        EmbeddingEncoder,
        SmallConvNet,
        create_backbone,
        load_backbone_weights,
    )
    from rl_gap.models.pretrained import PretrainedWeightsUnavailable, weights_from_checkpoint
