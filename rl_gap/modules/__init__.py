"""LightningModules: one per training recipe family, on a shared base."""

from rl_gap.modules.base import RankingModule
from rl_gap.modules.metric_learning import MetricLearningModule

__all__ = ["MetricLearningModule", "RankingModule"]
