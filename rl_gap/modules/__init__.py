"""LightningModules: one per training recipe family, on a shared base.

Names load on first use (:mod:`rl_gap.lazy`): ``rl_gap.modules.base`` does not pull in
open_clip or timm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl_gap.lazy import lazy_exports

_EXPORTS = {
    "CLIPFineTuneModule": ".clip_finetune",
    "MetricLearningModule": ".metric_learning",
    "MoCoV3Module": ".moco_v3",
    "RankingModule": ".base",
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
__all__ = [
    "CLIPFineTuneModule",
    "MetricLearningModule",
    "MoCoV3Module",
    "RankingModule",
]

if TYPE_CHECKING:
    from rl_gap.modules.base import RankingModule
    from rl_gap.modules.clip_finetune import CLIPFineTuneModule
    from rl_gap.modules.metric_learning import MetricLearningModule
    from rl_gap.modules.moco_v3 import MoCoV3Module
