"""Ranking metrics computed exactly from a ``RetrievalState`` (docs/definitions.md).

Every function returns float64 tensors; ties are pessimistic: a positive's
precision counts every item scoring >= it, as scikit-learn's
``average_precision_score`` does.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl_gap.metrics.functional.arguments import check_k, check_precision
from rl_gap.metrics.functional.state import RetrievalState

__all__ = [
    "global_curve",
    "global_ap_from_state",
    "per_query_ap",
    "mean_ap_from_state",
    "recall_at_k_from_state",
    "recall_at_precision_from_state",
    "global_f1_from_state",
    "per_query_f1_from_state",
    "per_query_r_metrics",
    "map_at_r_from_state",
    "r_precision_from_state",
    "query_mask_for_groups",
]

_NAN = float("nan")


def query_mask_for_groups(state: RetrievalState, groups: list[int] | None) -> Tensor | None:
    """(Q,) bool mask of queries in ``groups`` (None: all queries)."""
    if groups is None:
        return None
    mask = torch.zeros(state.num_queries, dtype=torch.bool, device=state.query_group.device)
    for group in groups:
        mask |= state.query_group == group
    return mask


def global_curve(
    state: RetrievalState, groups: list[int] | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Global counts at every grid value over the queries of ``groups``.

    Returns ``(tp_ge, fp_ge, count)``, each (G,) float64: positives and
    negatives scoring >= the grid value, and positives scoring exactly it.
    """
    index = state.pos_grid_index
    if groups is not None:
        keep = query_mask_for_groups(state, groups)[state.pos_query]
        index = index[keep]
        fp = state.grid_neg_ge[groups].sum(0)
    else:
        fp = state.grid_neg_ge.sum(0)
    count = torch.bincount(index, minlength=state.grid.numel()).double()
    tp = torch.flip(torch.cumsum(torch.flip(count, [0]), 0), [0])
    return tp, fp.double(), count


def global_ap_from_state(state: RetrievalState, groups: list[int] | None = None) -> Tensor:
    """gAP: AP of all valid pairs ranked in one list (NaN without positives)."""
    tp, fp, count = global_curve(state, groups)
    total = count.sum()
    if total == 0:
        return torch.tensor(_NAN, dtype=torch.float64)
    return (count * tp / (tp + fp)).sum() / total


def per_query_ap(state: RetrievalState, k: int | None = None) -> tuple[Tensor, Tensor]:
    """Per-query AP (or AP@k) and the (Q,) mask of queries with a positive.

    AP@k = (1/min(k, |P|)) · sum over positives with rank <= k of prec, with
    rank = #items scoring >= the positive (docs/definitions.md).
    """
    pos_ge = state.pos_pos_ge.double()
    rank = pos_ge + state.pos_neg_ge.double()
    precision = pos_ge / rank
    num_pos = state.num_positives
    if k is not None:
        k = check_k(k)
        precision = torch.where(rank <= k, precision, torch.zeros_like(precision))
        denominator = num_pos.clamp(max=k).double()
    else:
        denominator = num_pos.double()
    total = torch.zeros(state.num_queries, dtype=torch.float64, device=precision.device)
    total.index_add_(0, state.pos_query, precision)
    has_pos = num_pos > 0
    ap = torch.where(has_pos, total / denominator.clamp(min=1), torch.full_like(total, _NAN))
    return ap, has_pos


def _mean_over(values: Tensor, mask: Tensor) -> Tensor:
    if not bool(mask.any()):
        return torch.tensor(_NAN, dtype=torch.float64)
    return values[mask].mean()


def mean_ap_from_state(
    state: RetrievalState, k: int | None = None, query_mask: Tensor | None = None
) -> Tensor:
    """mAP (or mAP@k) over queries with >= 1 positive (NaN if none)."""
    ap, has_pos = per_query_ap(state, k)
    if query_mask is not None:
        has_pos = has_pos & query_mask
    return _mean_over(ap, has_pos)


def recall_at_k_from_state(
    state: RetrievalState, k: int, query_mask: Tensor | None = None
) -> Tensor:
    """R@k: share of queries (with >= 1 positive) with a positive in the top k.

    Ties are broken against the query: negatives tied with its best positive
    rank first, so a query counts iff fewer than k negatives score >= its best
    positive.
    """
    k = check_k(k)
    num_pos = state.num_positives
    has_pos = num_pos > 0
    first = torch.cumsum(num_pos, 0) - num_pos  # index of each query's best positive
    best_neg = torch.zeros(state.num_queries, dtype=torch.long, device=num_pos.device)
    best_neg[has_pos] = state.pos_neg_ge[first[has_pos]]
    hit = (best_neg < k).double()
    if query_mask is not None:
        has_pos = has_pos & query_mask
    return _mean_over(hit, has_pos)


def recall_at_precision_from_state(
    state: RetrievalState, precision: float = 0.9, groups: list[int] | None = None
) -> tuple[Tensor, Tensor]:
    """Largest recall over global thresholds whose precision is >= ``precision``.

    Only thresholds at positive scores can be optimal (lowering the threshold
    to the next positive keeps recall and adds negatives). Returns
    ``(recall, threshold)``; recall 0 and threshold +inf when none qualifies.
    """
    precision = check_precision(precision)
    tp, fp, count = global_curve(state, groups)
    total = count.sum()
    if total == 0:
        return torch.tensor(_NAN, dtype=torch.float64), torch.tensor(float("inf"))
    ok = (count > 0) & (tp / (tp + fp) >= precision)
    if not bool(ok.any()):
        return torch.zeros((), dtype=torch.float64), torch.tensor(float("inf"))
    recall = torch.where(ok, tp / total, torch.zeros_like(tp))
    best = int(torch.argmax(recall))  # largest recall; ties -> lowest grid index = lowest threshold
    return recall[best], state.grid[best].double().cpu()


def global_f1_from_state(
    state: RetrievalState, groups: list[int] | None = None
) -> tuple[Tensor, Tensor]:
    """Best F1 over one shared threshold: ``(f1, threshold)``."""
    tp, fp, count = global_curve(state, groups)
    total = count.sum()
    if total == 0:
        return torch.tensor(_NAN, dtype=torch.float64), torch.tensor(float("inf"))
    f1 = torch.where(count > 0, 2 * tp / (tp + fp + total), torch.zeros_like(tp))
    best = int(torch.argmax(f1))
    return f1[best], state.grid[best].double().cpu()


def per_query_f1_from_state(state: RetrievalState, query_mask: Tensor | None = None) -> Tensor:
    """F1q: mean over queries with positives of each query's best-threshold F1."""
    pos_ge = state.pos_pos_ge.double()
    num_pos = state.num_positives
    f1 = 2 * pos_ge / (pos_ge + state.pos_neg_ge.double() + num_pos[state.pos_query].double())
    best = torch.zeros(state.num_queries, dtype=torch.float64, device=f1.device)
    best.scatter_reduce_(0, state.pos_query, f1, reduce="amax")
    has_pos = num_pos > 0
    if query_mask is not None:
        has_pos = has_pos & query_mask
    return _mean_over(best, has_pos)


def per_query_r_metrics(state: RetrievalState) -> tuple[Tensor, Tensor, Tensor]:
    """Per-query MAP@R and R-precision (pytorch-metric-learning's definitions).

    R = the query's number of (valid) positives. Its ranking is cut at R with the
    engine's pessimistic tie order, the one R@k uses: a tie group's negatives rank
    before its positives. The positive j-th by score (j = 1..R, tied positives take
    consecutive places) then sits at position ``pos_neg_ge + j``; it counts if that is
    <= R, with precision j / position. MAP@R = (1/R) Σ of those precisions,
    R-precision = (number counted) / R (docs/definitions.md).

    Returns:
        ``(map_at_r, r_precision, has_pos)``: (Q,) float64 (NaN without positives)
        and the (Q,) bool mask of queries with R >= 1.
    """
    num_pos = state.num_positives
    has_pos = num_pos > 0
    first = torch.cumsum(num_pos, 0) - num_pos
    # positives are stored by query, then by decreasing score: j is the place among them
    j = torch.arange(state.pos_query.numel(), device=num_pos.device) - first[state.pos_query] + 1
    position = state.pos_neg_ge + j
    inside = position <= num_pos[state.pos_query]
    precision = torch.where(inside, j.double() / position.double(), torch.zeros_like(j.double()))
    map_sum = torch.zeros(state.num_queries, dtype=torch.float64, device=num_pos.device)
    map_sum.index_add_(0, state.pos_query, precision)
    hits = torch.zeros(state.num_queries, dtype=torch.float64, device=num_pos.device)
    hits.index_add_(0, state.pos_query, inside.double())
    r = num_pos.double().clamp(min=1)
    nan = torch.full_like(map_sum, _NAN)
    return (
        torch.where(has_pos, map_sum / r, nan),
        torch.where(has_pos, hits / r, nan),
        has_pos,
    )


def map_at_r_from_state(state: RetrievalState, query_mask: Tensor | None = None) -> Tensor:
    """MAP@R over queries with >= 1 positive (NaN if none); see ``per_query_r_metrics``."""
    value, _, has_pos = per_query_r_metrics(state)
    if query_mask is not None:
        has_pos = has_pos & query_mask
    return _mean_over(value, has_pos)


def r_precision_from_state(state: RetrievalState, query_mask: Tensor | None = None) -> Tensor:
    """R-precision over queries with >= 1 positive (NaN if none); see ``per_query_r_metrics``."""
    _, value, has_pos = per_query_r_metrics(state)
    if query_mask is not None:
        has_pos = has_pos & query_mask
    return _mean_over(value, has_pos)
