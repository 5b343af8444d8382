"""One call, every metric: ``evaluate_embeddings`` (docs/definitions.md) and ``metrics_from_state``."""

from __future__ import annotations

import torch
from torch import Tensor

from rl_gap.metrics.functional import ranking
from rl_gap.metrics.functional.bootstrap import bootstrap_from_state
from rl_gap.metrics.functional.ceiling import ceiling_from_state
from rl_gap.metrics.functional.dense import state_from_scores
from rl_gap.metrics.functional.engine import (
    as_tensor,
    check_embeddings,
    check_query_index,
    relevant_pairs_from_fn,
    state_from_embeddings,
)
from rl_gap.metrics.functional.protocol import split_classes, threshold_protocol_from_state
from rl_gap.metrics.functional.state import RetrievalState, torch_threads

__all__ = ["evaluate_embeddings", "evaluate_scores", "metrics_from_state", "query_groups"]

# Query groups: bit 0 = distractor query (no positive), bit 1 = eval half of the protocol.
_DISTRACTOR, _EVAL_HALF = 1, 2


def query_groups(has_positive: Tensor, protocol_half: Tensor | None) -> tuple[Tensor, int]:
    """Group id per query (distractor bit, protocol-half bit) and the number of groups."""
    group = (~has_positive.cpu()).long() * _DISTRACTOR
    if protocol_half is not None:
        group = group + protocol_half.cpu().long() * _EVAL_HALF
        return group, 4
    return group, 2


def metrics_from_state(*args, **kwargs) -> dict[str, float]:
    """Every metric from one state (``_metrics_from_state``), on one CPU thread
    (small ops; see ``torch_threads``)."""
    with torch_threads(1):
        return _metrics_from_state(*args, **kwargs)


def _metrics_from_state(
    state: RetrievalState,
    ks: tuple[int, ...] = (1, 5, 10),
    precisions: tuple[float, ...] = (0.9,),
    map_at: tuple[int, ...] = (),
    ceiling: bool | None = None,
    protocol: bool = False,
    bootstrap: int = 0,
    seed: int = 0,
) -> dict[str, float]:
    """Every metric from one state, as Python floats.

    Keys: ``gap``, ``gap_no_distractors``, ``map``, ``map@k``, ``r@k``,
    ``r@p{90}`` (+ ``threshold_p90``), ``f1g``/``f1q`` (best global / mean
    per-query F1 on all queries), ``ceiling``/``efficiency`` (when computed;
    ``ceiling=None`` computes it up to 2e6 positive pairs), ``protocol_*``
    (threshold protocol, when the state was built with protocol groups),
    ``gap_ci_*``/``map_ci_*`` (bootstrap), and counts ``num_queries``,
    ``num_positive_pairs``, ``num_pairs``, ``num_distractor_queries``.
    Groups follow ``query_groups``.
    """
    out: dict[str, float] = {}
    num_pos = state.num_positives
    out["gap"] = float(ranking.global_ap_from_state(state))
    num_groups = state.grid_neg_ge.shape[0]
    with_positive = [g for g in range(num_groups) if not g & _DISTRACTOR]
    if num_groups > 1:
        out["gap_no_distractors"] = float(ranking.global_ap_from_state(state, with_positive))
    else:
        out["gap_no_distractors"] = out["gap"]
    out["map"] = float(ranking.mean_ap_from_state(state))
    for k in map_at:
        out[f"map@{k}"] = float(ranking.mean_ap_from_state(state, k))
    for k in ks:
        out[f"r@{k}"] = float(ranking.recall_at_k_from_state(state, k))
    for p in precisions:
        recall, threshold = ranking.recall_at_precision_from_state(state, p)
        out[f"r@p{round(p * 100)}"] = float(recall)
        out[f"threshold_p{round(p * 100)}"] = float(threshold)
    out["f1g"] = float(ranking.global_f1_from_state(state)[0])
    out["f1q"] = float(ranking.per_query_f1_from_state(state))
    num_pairs = int(state.num_negatives.sum()) + int(num_pos.sum())
    if ceiling is None:
        ceiling = int(num_pos.sum()) <= 2_000_000
    if ceiling and int(num_pos.sum()) > 0:
        c = ceiling_from_state(state)
        out.update(c)
        out["efficiency"] = out["gap"] / c["ceiling"] if c["ceiling"] > 0 else float("nan")
    if protocol:
        if num_groups != 4:
            raise ValueError("protocol metrics need a state built with protocol groups")
        fit = [g for g in range(4) if not g & _EVAL_HALF]
        evaluate = [g for g in range(4) if g & _EVAL_HALF]
        for p in precisions:
            result = threshold_protocol_from_state(state, fit, evaluate, p)
            out.update({f"protocol_{k}": v for k, v in result.items()})
    if bootstrap > 0:
        out.update(bootstrap_from_state(state, bootstrap, seed=seed))
    out["num_queries"] = float(state.num_queries)
    out["num_positive_pairs"] = float(num_pos.sum())
    out["num_pairs"] = float(num_pairs)
    out["num_distractor_queries"] = float((num_pos == 0).sum())
    return out


def _positives_per_query(q_labels: Tensor, d_labels: Tensor, exclude_self: bool) -> Tensor:
    sorted_db = torch.sort(d_labels).values
    count = torch.searchsorted(sorted_db, q_labels, right=True) - torch.searchsorted(
        sorted_db, q_labels
    )
    return count - (1 if exclude_self else 0)


def evaluate_embeddings(
    queries,
    database=None,
    query_labels=None,
    database_labels=None,
    exclude_self: bool = False,
    *,
    query_index: Tensor | None = None,
    relevant_pairs: tuple[Tensor, Tensor] | None = None,
    relevance_fn=None,
    ks: tuple[int, ...] = (1, 5, 10),
    precisions: tuple[float, ...] = (0.9,),
    map_at: tuple[int, ...] = (),
    ceiling: bool | None = None,
    protocol: bool = False,
    bootstrap: int = 0,
    bootstrap_budget: int = 1 << 24,
    block_size: int | tuple[int, int] = 2048,
    device: torch.device | str | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Exact retrieval metrics from embeddings, never building the Q x D matrix.

    Scores are dot products (L2-normalise beforehand for cosine); relevance is
    "same label", or explicit: ``relevant_pairs = (query_idx, database_idx)``, or
    ``relevance_fn(query_idx, database_idx) -> bool block`` (``relevant_pairs_from_fn``).
    ``exclude_self`` (queries are the database) or ``query_index`` ((Q,) int64,
    distinct: query i is database row ``query_index[i]``, e.g. a query subset of
    the test set) excludes each query's self pair from every metric. Distractor queries (no positive)
    count in gAP, are excluded from mAP/R@k/F1q, and are reported as
    ``num_distractor_queries``. ``protocol=True`` adds the threshold protocol on
    a seeded split of the query classes; ``bootstrap=n`` adds 95% intervals.
    See ``metrics_from_state`` for the keys and ``state_from_embeddings`` for
    the engine. Returns Python floats.
    """
    queries_t = as_tensor(queries, "queries")
    check_embeddings(queries_t, "query embeddings")
    if database is not None:
        database = as_tensor(database, "database")
        if database is not queries_t:
            check_embeddings(database, "database embeddings")
    num_q = queries_t.shape[0]
    num_d = num_q if database is None else database.shape[0]
    self_index = check_query_index(query_index, num_q, num_d, exclude_self)
    if relevance_fn is not None:
        if relevant_pairs is not None:
            raise ValueError("give relevant_pairs or relevance_fn, not both")
        relevant_pairs = relevant_pairs_from_fn(relevance_fn, num_q, num_d)
    protocol_half = None
    if relevant_pairs is not None:
        if protocol:
            raise ValueError("the threshold protocol needs class labels, not relevant_pairs")
        q_idx = as_tensor(relevant_pairs[0], "relevant_pairs").long().cpu()
        d_idx = as_tensor(relevant_pairs[1], "relevant_pairs").long().cpu()
        if q_idx.numel() and (int(q_idx.min()) < 0 or int(q_idx.max()) >= num_q):
            raise ValueError("relevant_pairs index out of range")
        if self_index is not None and q_idx.numel():
            q_idx = q_idx[d_idx != self_index[q_idx]]
        has_positive = torch.bincount(q_idx, minlength=num_q)[:num_q] > 0
    else:
        if query_labels is None:
            raise ValueError("query_labels are required (or relevant_pairs)")
        q_lab = as_tensor(query_labels, "query_labels").cpu()
        d_lab = (
            q_lab
            if database_labels is None
            else as_tensor(database_labels, "database_labels").cpu()
        )
        if q_lab.ndim != 1 or q_lab.shape[0] != num_q:
            raise ValueError(
                f"query_labels has shape {tuple(q_lab.shape)}, expected ({num_q},) (one per query)"
            )
        if d_lab.ndim != 1:
            raise ValueError(f"database_labels must be 1-D, got shape {tuple(d_lab.shape)}")
        has_positive = _positives_per_query(q_lab.long(), d_lab.long(), self_index is not None) > 0
        if protocol:
            protocol_half = split_classes(q_lab, seed)
    group, num_groups = query_groups(has_positive, protocol_half)
    state = state_from_embeddings(
        queries_t, database, query_labels, database_labels, exclude_self=exclude_self,
        query_index=query_index, relevant_pairs=relevant_pairs, block_size=block_size, device=device,
        query_group=group, num_groups=num_groups,
        bootstrap_budget=bootstrap_budget if bootstrap > 0 else 0, validated=True,
    )  # fmt: skip
    return metrics_from_state(state, ks, precisions, map_at, ceiling, protocol, bootstrap, seed)


def evaluate_scores(
    scores: Tensor,
    rel: Tensor,
    valid: Tensor | None = None,
    *,
    query_labels: Tensor | None = None,
    ks: tuple[int, ...] = (1, 5, 10),
    precisions: tuple[float, ...] = (0.9,),
    map_at: tuple[int, ...] = (),
    ceiling: bool | None = None,
    bootstrap: int = 0,
    seed: int = 0,
) -> dict[str, float]:
    """``evaluate_embeddings`` for a materialised ``(scores, rel, valid)`` matrix.

    ``query_labels`` (Q,) enables the threshold protocol (split by query class).
    """
    if not isinstance(rel, Tensor) or not isinstance(scores, Tensor):
        raise ValueError("scores and rel must be torch tensors")
    has_positive = (
        (rel.bool() & (valid if valid is not None else True)).reshape(-1, rel.shape[-1])
    ).any(1)
    half = split_classes(query_labels, seed) if query_labels is not None else None
    group, num_groups = query_groups(has_positive, half)
    state = state_from_scores(
        scores, rel, valid, group.to(scores.device), num_groups, (1 << 24) if bootstrap else 0
    )
    return metrics_from_state(
        state, ks, precisions, map_at, ceiling, query_labels is not None, bootstrap, seed
    )
