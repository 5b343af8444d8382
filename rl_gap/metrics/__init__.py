"""Exact retrieval metrics: ``functional`` (pure tensor maths, the blocked
engine) and torchmetrics classes that accumulate embeddings across batches and
DDP ranks."""

from rl_gap.metrics.knn import WeightedKNNAccuracy
from rl_gap.metrics.retrieval import (
    GlobalAP,
    MeanAP,
    RecallAtK,
    RecallAtPrecision,
    RetrievalMetrics,
    ThresholdProtocol,
)
from rl_gap.metrics.tail import TailExtrapolatedMAP  # tail extrapolation (docs/definitions.md)

__all__ = [
    "GlobalAP",
    "MeanAP",
    "RecallAtK",
    "RecallAtPrecision",
    "RetrievalMetrics",
    "TailExtrapolatedMAP",
    "ThresholdProtocol",
    "WeightedKNNAccuracy",
]
