"""The engine's plan: one retrieval problem checked and put in label-sorted order.

``plan_problem`` turns the caller's inputs (embeddings, labels or explicit pairs,
self pairs, row subsets, score offsets) into a ``Plan``: where each sorted query
and database item is read from, the positive pairs in sorted coordinates, each
query's self column, and the block grid. The steps of ``engine.py`` read only the
plan; nothing in it holds a score.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from rl_gap.metrics.functional.arguments import check_block_size
from rl_gap.metrics.functional.engine_inputs import (
    as_tensor,
    check_embeddings,
    check_labels,
    check_query_index,
    check_rows,
    positive_pairs_from_labels,
    same_data,
)
from rl_gap.metrics.functional.state import argsort_stable, compute_dtype_for, unique_sorted

__all__ = ["Plan", "plan_problem", "block_bounds"]


def block_bounds(size: int, step: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` blocks of ``step`` rows covering ``range(size)``."""
    return [(s, min(size, s + step)) for s in range(0, size, step)]


@dataclass(frozen=True)
class Plan:
    """One retrieval problem in label-sorted order (positions 0..Q-1 / 0..D-1 below
    are *sorted* positions; ``perm_q`` maps them back to the caller's queries).

    Attributes:
        queries / database: the caller's embeddings, read block by block.
        q_source: (Q,) row of ``queries`` holding each sorted query.
        d_order: (D,) row of ``database`` holding each sorted item; None: row = position.
        perm_q: (Q,) the caller's index of each sorted query.
        pos_q / pos_d: (P,) sorted query / item of each positive pair (self pairs removed).
        self_col: (Q,) sorted database position of each query's self pair, or None.
        q_shift: (Q,) per sorted query score offset on the scoring device, or None.
        query_group: (Q,) group of each query in the caller's order (CPU int64).
        num_groups: number of query groups.
        device / dtype: where and in which dtype blocks are scored.
        rows_step / cols_step: block rows and columns.
        symmetric: score only blocks on or above the diagonal (leave-one-out on one set).
        normalize: L2-normalise every row as its block is read (cosine scores).
    """

    queries: Tensor
    database: Tensor
    q_source: Tensor
    d_order: Tensor | None
    perm_q: Tensor
    pos_q: Tensor
    pos_d: Tensor
    self_col: Tensor | None
    q_shift: Tensor | None
    query_group: Tensor
    num_groups: int
    device: torch.device
    dtype: torch.dtype
    rows_step: int
    cols_step: int
    symmetric: bool
    normalize: bool = False

    @property
    def num_queries(self) -> int:
        return self.q_source.numel()

    @property
    def num_database(self) -> int:
        return self.database.shape[0] if self.d_order is None else self.d_order.numel()

    @cached_property
    def row_blocks(self) -> list[tuple[int, int]]:
        return block_bounds(self.num_queries, self.rows_step)

    @cached_property
    def col_blocks(self) -> list[tuple[int, int]]:
        return block_bounds(self.num_database, self.cols_step)


def plan_problem(
    queries,
    database=None,
    query_labels=None,
    database_labels=None,
    *,
    exclude_self: bool = False,
    query_index: Tensor | None = None,
    relevant_pairs: tuple[Tensor, Tensor] | None = None,
    block_size: int | tuple[int, int] = 2048,
    device: torch.device | str | None = None,
    query_group: Tensor | None = None,
    num_groups: int = 1,
    validated: bool = False,
    symmetric: bool | None = None,
    query_rows: Tensor | None = None,
    database_rows: Tensor | None = None,
    query_offsets: Tensor | None = None,
    normalize: bool = False,
) -> Plan:
    """Check the inputs of ``state_from_embeddings`` (its problem's arguments, documented
    there; their defaults are these) and plan the problem: label-sorted order, positive
    pairs, self columns, blocks, whether to use symmetry."""
    queries = as_tensor(queries, "queries")
    database = queries if database is None else as_tensor(database, "database")
    _check_embedding_pair(queries, database, validated)
    same_rows = query_rows is database_rows
    query_rows = check_rows(query_rows, queries.shape[0], "query_rows")
    database_rows = check_rows(database_rows, database.shape[0], "database_rows")
    num_q = queries.shape[0] if query_rows is None else query_rows.numel()
    num_d = database.shape[0] if database_rows is None else database_rows.numel()
    self_index = check_query_index(query_index, num_q, num_d, exclude_self)
    device = torch.device(device) if device is not None else queries.device
    dtype = compute_dtype_for(torch.promote_types(queries.dtype, database.dtype))
    block_size = check_block_size(block_size)
    rows_step, cols_step = (block_size, block_size) if isinstance(block_size, int) else block_size

    if relevant_pairs is not None:
        perm_q, perm_d = torch.arange(num_q), None
        pos_q, pos_d = _explicit_pairs(relevant_pairs, num_q, num_d)
    else:
        if query_labels is None or database_labels is None:
            if query_labels is None or database is not queries:
                raise ValueError("give query_labels and database_labels, or relevant_pairs")
            database_labels = query_labels
        perm_q, perm_d, pos_q, pos_d = _label_sorted_pairs(
            query_labels, database_labels, num_q, num_d, self_index, exclude_self
        )
    self_col = None
    if self_index is not None:
        self_col = _self_columns(self_index, perm_q, perm_d, num_d)
        keep = pos_d != self_col[pos_q]
        pos_q, pos_d = pos_q[keep], pos_d[keep]

    d_order = perm_d
    if database_rows is not None:
        d_order = database_rows if d_order is None else database_rows[d_order]
    q_shift = _sorted_offsets(query_offsets, perm_q, num_q, device, dtype)
    symmetric = (
        symmetric is not False
        and exclude_self
        and relevant_pairs is None
        and same_data(database, queries)
        and same_rows
        and q_shift is None
        and rows_step == cols_step
    )
    group = (
        torch.zeros(num_q, dtype=torch.long)
        if query_group is None
        else as_tensor(query_group, "query_group").long().cpu()
    )
    return Plan(
        queries, database, perm_q if query_rows is None else query_rows[perm_q], d_order,
        perm_q, pos_q, pos_d, self_col, q_shift, group, num_groups, device, dtype,
        rows_step, cols_step, symmetric, bool(normalize),
    )  # fmt: skip


def _check_embedding_pair(queries: Tensor, database: Tensor, validated: bool) -> None:
    if not validated:
        check_embeddings(queries, "query embeddings")
        if database is not queries:
            check_embeddings(database, "database embeddings")
    if queries.shape[1] != database.shape[1]:
        raise ValueError(
            f"embedding dims differ: queries {tuple(queries.shape)}, database {tuple(database.shape)}"
        )


def _explicit_pairs(relevant_pairs, num_q: int, num_d: int) -> tuple[Tensor, Tensor]:
    """Checked, deduplicated ``(query_idx, database_idx)`` positives, sorted by pair."""
    q_idx, d_idx = (as_tensor(t, "relevant_pairs").long().cpu() for t in relevant_pairs)
    if q_idx.shape != d_idx.shape or q_idx.ndim != 1:
        raise ValueError("relevant_pairs must be two 1-D index tensors of equal length")
    if q_idx.numel() and (
        q_idx.min() < 0 or q_idx.max() >= num_q or d_idx.min() < 0 or d_idx.max() >= num_d
    ):
        raise ValueError("relevant_pairs index out of range")
    key = unique_sorted(q_idx * num_d + d_idx)
    return key // num_d, key % num_d


def _label_sorted_pairs(
    query_labels, database_labels, num_q: int, num_d: int, self_index, exclude_self: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(perm_q, perm_d, pos_q, pos_d)``: stable label sorts of queries and database
    and every equal-label pair in sorted coordinates."""
    q_lab = check_labels(as_tensor(query_labels, "query_labels").cpu(), num_q, "query_labels")
    d_lab = check_labels(
        as_tensor(database_labels, "database_labels").cpu(), num_d, "database_labels"
    )
    if self_index is not None and not bool((q_lab == d_lab[self_index]).all()):
        raise ValueError(
            "exclude_self / query_index: a query's label differs from its database row's "
            "(query_labels must equal database_labels[query_index])"
        )
    perm_q = argsort_stable(q_lab)
    perm_d = perm_q if exclude_self else argsort_stable(d_lab)
    pos_q, pos_d = positive_pairs_from_labels(q_lab[perm_q], d_lab[perm_d], False)
    return perm_q, perm_d, pos_q, pos_d


def _self_columns(self_index: Tensor, perm_q: Tensor, perm_d: Tensor | None, num_d: int) -> Tensor:
    """Sorted database position of each sorted query's self pair."""
    if perm_d is None:
        return self_index[perm_q]
    inv_perm_d = torch.empty_like(perm_d)
    inv_perm_d[perm_d] = torch.arange(num_d)
    return inv_perm_d[self_index[perm_q]]


def _sorted_offsets(query_offsets, perm_q: Tensor, num_q: int, device, dtype) -> Tensor | None:
    """Per sorted query score offsets on the scoring device (None without offsets)."""
    if query_offsets is None:
        return None
    shift = as_tensor(query_offsets, "query_offsets")
    if shift.shape != (num_q,):
        raise ValueError(
            f"query_offsets must be ({num_q},) (one per query), got {tuple(shift.shape)}"
        )
    return shift.to(device=device, dtype=dtype)[perm_q.to(device)]
