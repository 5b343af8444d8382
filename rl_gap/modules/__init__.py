"""LightningModules: one per training recipe family, on a shared base.

Names load on first use (:mod:`rl_gap.lazy`): ``rl_gap.modules.base`` does not pull in
open_clip or timm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl_gap.lazy import by_module, lazy_exports

_EXPORTS = by_module(
    {
        ".clip_finetune": ("CLIPFineTuneModule",),
        ".metric_learning": ("MetricLearningModule",),
        ".moco_v3": ("MoCoV3Module",),
        ".base": ("RankingModule",),
    }
)
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # the same names, for type checkers (__all__ is built above)
    from rl_gap.modules.base import RankingModule
    from rl_gap.modules.clip_finetune import CLIPFineTuneModule
    from rl_gap.modules.metric_learning import MetricLearningModule
    from rl_gap.modules.moco_v3 import MoCoV3Module
