"""Encoders: timm backbone + embedding head (metric learning)."""

from rl_gap.models.encoder import EmbeddingEncoder, SmallConvNet, load_backbone_weights

__all__ = ["EmbeddingEncoder", "SmallConvNet", "load_backbone_weights"]
