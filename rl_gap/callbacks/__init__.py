"""Lightning callbacks: retrieval evaluation through the metric engine, consistency plots,
model selection that never looks at the test split.

Names load on first use (:mod:`rl_gap.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl_gap.lazy import lazy_exports

_EXPORTS = {
    "ModelSelectionGuard": ".selection",
    "RetrievalEvaluation": ".retrieval",
    "guard_model_selection": ".selection",
    "global_pr_curve": ".curves",
    "per_query_best_thresholds": ".curves",
    "save_consistency_plots": ".plots",
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
__all__ = [
    "ModelSelectionGuard",
    "RetrievalEvaluation",
    "global_pr_curve",
    "guard_model_selection",
    "per_query_best_thresholds",
    "save_consistency_plots",
]

if TYPE_CHECKING:
    from rl_gap.callbacks.curves import global_pr_curve, per_query_best_thresholds
    from rl_gap.callbacks.plots import save_consistency_plots
    from rl_gap.callbacks.retrieval import RetrievalEvaluation
    from rl_gap.callbacks.selection import ModelSelectionGuard, guard_model_selection
