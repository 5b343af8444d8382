"""Exact retrieval metrics: ``functional`` (pure tensor maths, the blocked
engine) and torchmetrics classes that accumulate embeddings across batches and
DDP ranks.

Names load on first use (:mod:`rl_gap.lazy`): ``rl_gap.metrics.functional`` and
``rl_gap.metrics.tail`` do not import torchmetrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl_gap.lazy import lazy_exports

_EXPORTS = {
    "WeightedKNNAccuracy": ".knn",
    "GlobalAP": ".retrieval",
    "MeanAP": ".retrieval",
    "MAPAtR": ".retrieval",
    "RPrecision": ".retrieval",
    "RecallAtK": ".retrieval",
    "RecallAtPrecision": ".retrieval",
    "RetrievalMetrics": ".retrieval",
    "ThresholdProtocol": ".retrieval",
    "TailExtrapolatedMAP": ".tail",
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
__all__ = [
    "GlobalAP",
    "MAPAtR",
    "MeanAP",
    "RPrecision",
    "RecallAtK",
    "RecallAtPrecision",
    "RetrievalMetrics",
    "TailExtrapolatedMAP",
    "ThresholdProtocol",
    "WeightedKNNAccuracy",
]

if TYPE_CHECKING:
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
