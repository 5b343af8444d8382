"""Lightning callbacks: retrieval evaluation through the metric engine, consistency plots."""

from rl_gap.callbacks.curves import global_pr_curve, per_query_best_thresholds
from rl_gap.callbacks.retrieval import RetrievalEvaluation, save_consistency_plots

__all__ = [
    "RetrievalEvaluation",
    "global_pr_curve",
    "per_query_best_thresholds",
    "save_consistency_plots",
]
