"""Inputs of ``evaluate_embeddings``: option checks, embeddings, relevance per query."""

from __future__ import annotations

import torch
from torch import Tensor

from rl_gap.metrics.functional.engine_inputs import (
    as_tensor,
    check_embeddings,
    check_labels,
    check_query_index,
    relevant_pairs_from_fn,
)

__all__ = ["check_options", "checked_embeddings", "positives_per_query", "relevance"]


def positives_per_query(q_labels: Tensor, d_labels: Tensor, exclude_self: bool) -> Tensor:
    """(Q,) database items sharing each query's label (less its self pair)."""
    sorted_db = torch.sort(d_labels).values
    count = torch.searchsorted(sorted_db, q_labels, right=True) - torch.searchsorted(
        sorted_db, q_labels
    )
    return count - (1 if exclude_self else 0)


def check_options(
    protocol_failure, recall_over_database, relevant_pairs, relevance_fn, protocol,
    background, score_norm, normalize,
) -> None:  # fmt: skip
    """Refuse option combinations of ``evaluate_embeddings`` that have no meaning."""
    if protocol_failure not in ("raise", "nan"):
        raise ValueError(f'protocol_failure must be "raise" or "nan", got {protocol_failure!r}')
    explicit = relevant_pairs is not None or relevance_fn is not None
    if recall_over_database and explicit:
        raise ValueError("recall_over_database needs class labels, not relevant_pairs")
    if recall_over_database and background is not None:
        raise ValueError("recall_over_database ranks raw scores: give no background")
    if score_norm is not None and background is None:
        raise ValueError("score_norm needs background embeddings (background=)")
    if normalize and background is not None:
        raise ValueError(
            "normalize with background: L2-normalise the embeddings and the background beforehand"
        )
    if relevance_fn is not None and relevant_pairs is not None:
        raise ValueError("give relevant_pairs or relevance_fn, not both")
    if explicit and protocol:
        raise ValueError("the threshold protocol needs class labels, not relevant_pairs")


def checked_embeddings(queries, database, query_index, exclude_self: bool):
    """``(queries, database or None, self_index)``: tensors scanned for NaN/inf once,
    and the validated self pairs (``check_query_index``)."""
    queries_t = as_tensor(queries, "queries")
    check_embeddings(queries_t, "query embeddings")
    if database is not None:
        database = as_tensor(database, "database")
        if database is not queries_t:
            check_embeddings(database, "database embeddings")
    num_q = queries_t.shape[0]
    num_d = num_q if database is None else database.shape[0]
    return queries_t, database, check_query_index(query_index, num_q, num_d, exclude_self)


def relevance(
    relevant_pairs, relevance_fn, query_labels, database_labels, queries, database, self_index
):
    """``(relevant_pairs, has_positive (Q,), query labels, database labels)``: explicit
    pairs (``relevance_fn`` evaluated block-wise) with labels None, or checked labels."""
    num_q = queries.shape[0]
    num_d = num_q if database is None else database.shape[0]
    if relevance_fn is not None:
        relevant_pairs = relevant_pairs_from_fn(relevance_fn, num_q, num_d)
    has_positive, q_lab, d_lab = _label_relevance(
        relevant_pairs, query_labels, database_labels, num_q, num_d, self_index
    )
    return relevant_pairs, has_positive, q_lab, d_lab


def _label_relevance(
    relevant_pairs, query_labels, database_labels, num_q: int, num_d: int, self_index
):
    """``(has_positive (Q,), query labels, database labels)``; labels are None with
    explicit ``relevant_pairs``."""
    if relevant_pairs is not None:
        q_idx = as_tensor(relevant_pairs[0], "relevant_pairs").long().cpu()
        d_idx = as_tensor(relevant_pairs[1], "relevant_pairs").long().cpu()
        if q_idx.numel() and (int(q_idx.min()) < 0 or int(q_idx.max()) >= num_q):
            raise ValueError("relevant_pairs index out of range")
        if self_index is not None and q_idx.numel():
            q_idx = q_idx[d_idx != self_index[q_idx]]
        return torch.bincount(q_idx, minlength=num_q)[:num_q] > 0, None, None
    if query_labels is None:
        raise ValueError("query_labels are required (or relevant_pairs)")
    q_lab = as_tensor(query_labels, "query_labels").cpu()
    d_lab = (
        q_lab if database_labels is None else as_tensor(database_labels, "database_labels").cpu()
    )
    if q_lab.ndim != 1 or q_lab.shape[0] != num_q:
        raise ValueError(
            f"query_labels has shape {tuple(q_lab.shape)}, expected ({num_q},) (one per query)"
        )
    if d_lab.ndim != 1:
        raise ValueError(f"database_labels must be 1-D, got shape {tuple(d_lab.shape)}")
    q_lab = check_labels(q_lab, num_q, "query_labels")
    d_lab = check_labels(d_lab, num_d, "database_labels")
    return positives_per_query(q_lab, d_lab, self_index is not None) > 0, q_lab, d_lab
