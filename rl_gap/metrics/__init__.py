"""Exact retrieval metrics: ``functional`` (pure tensor maths, the blocked
engine) and torchmetrics classes that accumulate embeddings across batches and
DDP ranks.

Names load on first use (:mod:`rl_gap.lazy`): ``rl_gap.metrics.functional`` and
``rl_gap.metrics.tail`` do not import torchmetrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl_gap.lazy import by_module, lazy_exports

_EXPORTS = by_module(
    {
        ".knn": ("WeightedKNNAccuracy",),
        ".retrieval": (
            "GlobalAP",
            "MAPAtR",
            "MeanAP",
            "RPrecision",
            "RecallAtK",
            "RecallAtPrecision",
            "RetrievalMetrics",
            "ThresholdProtocol",
        ),
        ".tail": ("TailExtrapolatedMAP",),
    }
)
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # the same names, for type checkers (__all__ is built above)
    from rl_gap.metrics.knn import WeightedKNNAccuracy
    from rl_gap.metrics.retrieval import (
        GlobalAP,
        MAPAtR,
        MeanAP,
        RecallAtK,
        RecallAtPrecision,
        RetrievalMetrics,
        RPrecision,
        ThresholdProtocol,
    )
    from rl_gap.metrics.tail import TailExtrapolatedMAP
