"""Functional retrieval metrics on a materialised matrix ``(scores, rel, valid)``.

Same calling convention as the losses (docs/definitions.md): ``scores`` (Q, D) float,
``rel`` (Q, D) bool, ``valid`` optional (Q, D) bool (False = pair ignored).
Each returns a 0-d tensor on the scores' device, float64 when the scores are
float64 (float32 otherwise). Definitions with pessimistic ties: docs/definitions.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl_gap.metrics.functional import ranking
from rl_gap.metrics.functional.arguments import check_precision, precision_tag
from rl_gap.metrics.functional.ceiling import ceiling_from_state
from rl_gap.metrics.functional.dense import state_from_scores
from rl_gap.metrics.functional.protocol import threshold_protocol_from_states

__all__ = [
    "global_ap",
    "mean_ap",
    "recall_at_k",
    "map_at_r",
    "r_precision",
    "recall_at_precision",
    "global_f1",
    "per_query_f1",
    "threshold_protocol",
    "consistency_ceiling",
]


def _out(value: Tensor, scores: Tensor) -> Tensor:
    dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    return value.to(device=scores.device, dtype=dtype)


def global_ap(scores: Tensor, rel: Tensor, valid: Tensor | None = None) -> Tensor:
    """Global AP: one AP over every valid pair (gSAP paper §3.1).

    Rows without positives still add their pairs as negatives. NaN if no
    valid positive exists.

    Example:
        Query 1's negative (0.95) outranks every positive, so the one global
        list is 0.95-, 0.9+, 0.8+, 0.1- and gAP = (1/2 + 2/3)/2, as
        scikit-learn's ``average_precision_score`` gives on the flattened
        pairs. Masking that negative out (``valid``) leaves a perfect ranking:

        >>> import torch
        >>> from rl_gap.metrics.functional import global_ap
        >>> scores = torch.tensor([[0.9, 0.1], [0.95, 0.8]])
        >>> rel = torch.eye(2, dtype=torch.bool)
        >>> global_ap(scores, rel)
        tensor(0.5833)
        >>> global_ap(scores, rel, valid=torch.tensor([[True, True], [False, True]]))
        tensor(1.)
    """
    state = state_from_scores(scores, rel, valid)
    return _out(ranking.global_ap_from_state(state), scores)


def mean_ap(
    scores: Tensor, rel: Tensor, valid: Tensor | None = None, k: int | None = None
) -> Tensor:
    """mAP over rows with >= 1 positive; ``k`` gives mAP@k (normalised by min(k, |P|))."""
    state = state_from_scores(scores, rel, valid)
    return _out(ranking.mean_ap_from_state(state, k), scores)


def recall_at_k(scores: Tensor, rel: Tensor, valid: Tensor | None = None, k: int = 1) -> Tensor:
    """Share of rows with >= 1 positive having a positive in the top ``k``
    (ties broken against the row: tied negatives rank first)."""
    state = state_from_scores(scores, rel, valid)
    return _out(ranking.recall_at_k_from_state(state, k), scores)


def map_at_r(scores: Tensor, rel: Tensor, valid: Tensor | None = None) -> Tensor:
    """MAP@R (Musgrave et al. 2020, pytorch-metric-learning): per row with R >= 1
    positives, (1/R) Σ_{i<=R} P(i)·rel(i) over the row's top R; mean over those rows.
    Ties: a tie group's negatives rank before its positives (docs/definitions.md).

    Example:
        Row 0 ranks 0.9+, 0.8-, 0.7+ (R = 2): MAP@R = (1/1)/2 = 0.5; row 1's one
        positive ties with its negative, which ranks first: MAP@R = 0. Mean 0.25.
        R-precision (``r_precision``) of the same rows: 1/2 and 0, mean 0.25.

        >>> import torch
        >>> from rl_gap.metrics.functional import map_at_r, r_precision
        >>> scores = torch.tensor([[0.9, 0.8, 0.7], [0.5, 0.5, 0.1]], dtype=torch.float64)
        >>> rel = torch.tensor([[True, False, True], [True, False, False]])
        >>> map_at_r(scores, rel)
        tensor(0.2500, dtype=torch.float64)
        >>> r_precision(scores, rel)
        tensor(0.2500, dtype=torch.float64)
    """
    state = state_from_scores(scores, rel, valid)
    return _out(ranking.map_at_r_from_state(state), scores)


def r_precision(scores: Tensor, rel: Tensor, valid: Tensor | None = None) -> Tensor:
    """R-precision: per row with R >= 1 positives, the share of positives in its top R
    (ties as in ``map_at_r``); mean over those rows. Example: ``map_at_r``'s, whose two
    rows have R-precision 1/2 and 0.
    """
    state = state_from_scores(scores, rel, valid)
    return _out(ranking.r_precision_from_state(state), scores)


def recall_at_precision(
    scores: Tensor, rel: Tensor, valid: Tensor | None = None, precision: float = 0.9
) -> Tensor:
    """Largest recall over global thresholds whose precision is >= ``precision`` (0 if none)."""
    state = state_from_scores(scores, rel, valid)
    return _out(ranking.recall_at_precision_from_state(state, precision)[0], scores)


def global_f1(scores: Tensor, rel: Tensor, valid: Tensor | None = None) -> Tensor:
    """Best F1 of one shared (global) threshold over all valid pairs."""
    state = state_from_scores(scores, rel, valid)
    return _out(ranking.global_f1_from_state(state)[0], scores)


def per_query_f1(scores: Tensor, rel: Tensor, valid: Tensor | None = None) -> Tensor:
    """Mean over rows with >= 1 positive of the row's best-threshold F1 (F1q)."""
    state = state_from_scores(scores, rel, valid)
    return _out(ranking.per_query_f1_from_state(state), scores)


def threshold_protocol(
    scores: Tensor,
    rel: Tensor,
    valid: Tensor | None = None,
    *,
    query_labels: Tensor,
    database_labels: Tensor,
    precision: float = 0.9,
    seed: int = 0,
) -> dict[str, Tensor]:
    """Shared-threshold protocol (gSAP paper §C.3) on a materialised matrix.

    The classes (``query_labels`` (Q,), ``database_labels`` (D,): the class of each
    row and column) are split in two seeded halves (``protocol_halves``); each half
    is its own problem, its rows against its columns. Thresholds are fitted on the
    first and ``{"f1g", "r@p90", "f1q"}`` reported on the second.
    """
    from rl_gap.metrics.functional.suite import score_protocol_states

    precision = check_precision(precision)
    fit, evaluate = score_protocol_states(
        scores, rel, valid, query_labels, database_labels, (precision,), seed
    )
    out = threshold_protocol_from_states(fit, evaluate, (precision,))
    tag = f"r@p{precision_tag(precision)}"
    return {k: _out(torch.tensor(out[k], dtype=torch.float64), scores) for k in ("f1g", tag, "f1q")}


def consistency_ceiling(
    scores: Tensor, rel: Tensor, valid: Tensor | None = None
) -> dict[str, Tensor]:
    """Consistency ceiling C (a lower bound on the best order-preserving
    interleaving's gAP, see ``ceiling.py``), its upper bound ``ceiling_upper``,
    ``ceiling_gap`` = upper − C, and ``efficiency = gAP / C``."""
    state = state_from_scores(scores, rel, valid)
    result = ceiling_from_state(state)
    gap = float(ranking.global_ap_from_state(state))
    result["efficiency"] = gap / result["ceiling"]
    keys = ("ceiling", "ceiling_upper", "ceiling_gap", "efficiency")
    return {k: _out(torch.tensor(result[k], dtype=torch.float64), scores) for k in keys}
