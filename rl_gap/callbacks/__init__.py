"""Lightning callbacks: retrieval evaluation through the metric engine, consistency plots,
model selection that never looks at the test split."""

from rl_gap.callbacks.curves import global_pr_curve, per_query_best_thresholds
from rl_gap.callbacks.plots import save_consistency_plots
from rl_gap.callbacks.retrieval import RetrievalEvaluation
from rl_gap.callbacks.selection import ModelSelectionGuard, guard_model_selection

__all__ = [
    "ModelSelectionGuard",
    "RetrievalEvaluation",
    "guard_model_selection",
    "global_pr_curve",
    "per_query_best_thresholds",
    "save_consistency_plots",
]
