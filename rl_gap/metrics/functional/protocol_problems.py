"""The threshold protocol's (fit, eval) problems from embeddings or from a matrix.

Each half of the classes (``protocol_halves``) is its own retrieval problem: the
half's queries against the half's database items only (``protocol.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl_gap.metrics.functional.dense import state_from_scores
from rl_gap.metrics.functional.engine import state_from_embeddings
from rl_gap.metrics.functional.engine_inputs import as_tensor, check_labels, check_query_index
from rl_gap.metrics.functional.protocol import protocol_halves, protocol_states
from rl_gap.metrics.functional.state import RetrievalState

__all__ = ["embedding_protocol_states", "score_protocol_states"]


def embedding_protocol_states(
    queries: Tensor,
    database: Tensor | None,
    query_labels: Tensor,
    database_labels: Tensor,
    *,
    exclude_self: bool = False,
    query_index: Tensor | None = None,
    precisions: tuple[float, ...] = (0.9,),
    seed: int = 0,
    query_offsets: Tensor | None = None,
    **engine_kwargs,
) -> tuple[RetrievalState, RetrievalState]:
    """The threshold protocol's (fit, eval) problems from embeddings (``protocol.py``):
    each half's queries against that half's database items only.

    Args:
        queries / database: (Q, dim) / (D, dim) embeddings (database None = queries).
        query_labels / database_labels: (Q,) / (D,) integer labels.
        exclude_self / query_index: self pairs, as in ``state_from_embeddings``.
        query_offsets: optional (Q,) score shifts (query-side normalisation).
        engine_kwargs: ``block_size``, ``device``, ``cache_bytes``, ``shard`` of the engine.
    """
    queries = as_tensor(queries, "queries")
    database = queries if database is None else as_tensor(database, "database")
    query_labels = check_labels(
        as_tensor(query_labels, "query_labels").cpu(), len(queries), "query_labels"
    )
    database_labels = check_labels(
        as_tensor(database_labels, "database_labels").cpu(), len(database), "database_labels"
    )
    self_index = check_query_index(query_index, len(queries), len(database), exclude_self)
    q_half, d_half = protocol_halves(query_labels, database_labels, seed)

    def build(half: int, extra: Tensor | None) -> RetrievalState:
        q_rows = torch.nonzero(q_half == half).flatten()
        d_rows = torch.nonzero(d_half == half).flatten()
        if d_rows.numel() == 0:
            raise ValueError(
                f"threshold protocol: the {('fit', 'eval')[half]} half of the classes has no "
                "database item"
            )
        # Each half reads its rows block by block (query_rows / database_rows): no copy.
        q_lab = query_labels[q_rows]
        shift = None if query_offsets is None else query_offsets[q_rows]
        if exclude_self:
            return state_from_embeddings(
                queries, queries, q_lab, q_lab, exclude_self=True, extra_grid=extra,
                query_rows=q_rows, database_rows=q_rows, query_offsets=shift, **engine_kwargs,
            )  # fmt: skip
        index = None
        if self_index is not None:
            position = torch.full((len(database),), -1, dtype=torch.long)
            position[d_rows] = torch.arange(d_rows.numel())
            index = position[self_index[q_rows]]  # a query's row has its label: same half
        return state_from_embeddings(
            queries, database, q_lab, database_labels[d_rows], query_index=index,
            extra_grid=extra, query_rows=q_rows, database_rows=d_rows, query_offsets=shift,
            **engine_kwargs,
        )  # fmt: skip

    return protocol_states(build, precisions)


def score_protocol_states(
    scores: Tensor,
    rel: Tensor,
    valid: Tensor | None,
    query_labels: Tensor | None,
    database_labels: Tensor | None,
    precisions: tuple[float, ...] = (0.9,),
    seed: int = 0,
) -> tuple[RetrievalState, RetrievalState]:
    """The threshold protocol's (fit, eval) problems of a materialised matrix: rows and
    columns of each half of the classes (``protocol_halves``)."""
    if query_labels is None or database_labels is None:
        raise ValueError(
            "the threshold protocol needs query_labels (Q,) and database_labels (D,): the "
            "class of every row and column, to split both into halves"
        )
    if scores.ndim != 2:
        raise ValueError(f"scores must be (Q, D), got shape {tuple(scores.shape)}")
    q_lab = check_labels(
        as_tensor(query_labels, "query_labels").cpu(), scores.shape[0], "query_labels"
    )
    d_lab = check_labels(
        as_tensor(database_labels, "database_labels").cpu(), scores.shape[1], "database_labels"
    )
    q_half, d_half = protocol_halves(q_lab, d_lab, seed)
    device = scores.device

    def build(half: int, extra: Tensor | None) -> RetrievalState:
        rows = torch.nonzero(q_half == half).flatten().to(device)
        cols = torch.nonzero(d_half == half).flatten().to(device)
        if cols.numel() == 0:
            raise ValueError(
                f"threshold protocol: the {('fit', 'eval')[half]} half of the classes has no "
                "database column"
            )

        def sub(matrix: Tensor | None) -> Tensor | None:
            return None if matrix is None else matrix[rows][:, cols]

        return state_from_scores(sub(scores), sub(rel), sub(valid), extra_grid=extra)

    return protocol_states(build, precisions)
