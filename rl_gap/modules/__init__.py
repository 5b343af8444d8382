"""LightningModules: one per training recipe family, on a shared base."""

from rl_gap.modules.base import RankingModule
from rl_gap.modules.clip_finetune import CLIPFineTuneModule
from rl_gap.modules.metric_learning import MetricLearningModule
from rl_gap.modules.moco_v3 import MoCoV3Module

__all__ = ["CLIPFineTuneModule", "MetricLearningModule", "MoCoV3Module", "RankingModule"]
