"""Exact retrieval metrics as functions of tensors (no Lightning).

- ``global_ap``, ``mean_ap``, ``recall_at_k``, ``recall_at_precision``,
  ``map_at_r``, ``r_precision``,
  ``global_f1``, ``per_query_f1``: on a materialised ``(scores, rel, valid)``.
- ``evaluate_embeddings``: every metric from embeddings and labels in one pass
  over GEMM blocks, never building the Q x D matrix.
- ``background_offsets``, ``normalize_scores``, ``offset_embeddings``: query-side
  score normalisation against a background set (``score_norm.py``).
"""

from rl_gap.metrics.functional.bootstrap import bootstrap_from_state
from rl_gap.metrics.functional.ceiling import ceiling_from_state
from rl_gap.metrics.functional.dense import state_from_scores
from rl_gap.metrics.functional.engine import state_from_embeddings
from rl_gap.metrics.functional.protocol import (
    protocol_halves,
    split_classes,
    threshold_protocol_from_states,
)
from rl_gap.metrics.functional.retrieval import (
    consistency_ceiling,
    global_ap,
    global_f1,
    map_at_r,
    mean_ap,
    per_query_f1,
    r_precision,
    recall_at_k,
    recall_at_precision,
    threshold_protocol,
)
from rl_gap.metrics.functional.score_norm import (
    ScoreNorm,
    background_offsets,
    normalize_scores,
    offset_embeddings,
)
from rl_gap.metrics.functional.state import RetrievalState
from rl_gap.metrics.functional.suite import evaluate_embeddings, evaluate_scores, metrics_from_state

__all__ = [
    "RetrievalState",
    "ScoreNorm",
    "background_offsets",
    "normalize_scores",
    "offset_embeddings",
    "bootstrap_from_state",
    "ceiling_from_state",
    "consistency_ceiling",
    "evaluate_embeddings",
    "evaluate_scores",
    "metrics_from_state",
    "split_classes",
    "state_from_embeddings",
    "threshold_protocol",
    "threshold_protocol_from_states",
    "protocol_halves",
    "global_ap",
    "global_f1",
    "map_at_r",
    "mean_ap",
    "per_query_f1",
    "r_precision",
    "recall_at_k",
    "recall_at_precision",
    "state_from_scores",
]
