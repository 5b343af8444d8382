"""LightningModules: one per training recipe family, on a shared base."""

from rl_gap.modules.base import RankingModule

__all__ = ["RankingModule"]
