"""Lightning callbacks: retrieval evaluation through the metric engine, consistency plots,
model selection that never looks at the test split.

Names load on first use (:mod:`rl_gap.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl_gap.lazy import by_module, lazy_exports

_EXPORTS = by_module(
    {
        ".selection": ("ModelSelectionGuard", "guard_model_selection"),
        ".retrieval": ("RetrievalEvaluation",),
        ".curves": ("global_pr_curve", "per_query_best_thresholds"),
        ".plots": ("save_consistency_plots",),
    }
)
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # the same names, for type checkers (__all__ is built above)
    from rl_gap.callbacks.curves import global_pr_curve, per_query_best_thresholds
    from rl_gap.callbacks.plots import save_consistency_plots
    from rl_gap.callbacks.retrieval import RetrievalEvaluation
    from rl_gap.callbacks.selection import ModelSelectionGuard, guard_model_selection
