"""Input checks and relevance for the evaluation engine (``engine.py``)."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import Tensor

from rl_gap.metrics.functional.state import unique_sorted

__all__ = [
    "as_tensor",
    "check_embeddings",
    "check_labels",
    "check_query_index",
    "check_rows",
    "positive_pairs_from_labels",
    "relevant_pairs_from_fn",
    "same_data",
]


def as_tensor(x, name: str) -> Tensor:
    """Tensor view of a tensor / numpy array (memory maps stay mapped)."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray):
        if x.dtype == object or x.dtype.kind in "USO":
            raise ValueError(f"{name} must be numeric, got numpy dtype {x.dtype}")
        with warnings.catch_warnings():
            # Read-only memory maps: the engine only ever reads them.
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(x)
    raise ValueError(f"{name} must be a torch.Tensor or numpy array, got {type(x).__name__}")


def check_embeddings(x: Tensor, name: str) -> None:
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D (N, dim), got shape {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)})")
    if not x.dtype.is_floating_point:
        raise ValueError(f"{name} must be floating point, got dtype {x.dtype}")
    # Chunks of ~1M values: the scan's temporaries stay a few MB whatever the size of x.
    step = max(1, (1 << 20) // max(1, x.shape[1]))
    for start in range(0, x.shape[0], step):
        if not bool(torch.isfinite(x[start : start + step]).all()):
            raise ValueError(f"{name} contain NaN or inf")


def check_labels(labels: Tensor, count: int, name: str) -> Tensor:
    if labels.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(labels.shape)}")
    if labels.shape[0] != count:
        raise ValueError(f"{name} has length {labels.shape[0]}, expected {count} (one per row)")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        if labels.dtype.is_floating_point and not bool((labels == labels.round()).all()):
            bad = labels[labels != labels.round()][0].item()
            raise ValueError(
                f"{name} must be integer class ids, got dtype {labels.dtype} with non-integer "
                f"values (e.g. {bad}); they are never truncated"
            )
    return labels.long()


def check_query_index(
    query_index, num_queries: int, num_database: int, exclude_self: bool = False
) -> Tensor | None:
    """Validated self pairs: query i is database row ``query_index[i]`` (CPU int64).

    ``exclude_self=True`` (queries are the database) means ``arange(Q)``. Returns None
    when no pair is excluded.
    """
    if query_index is None:
        if not exclude_self:
            return None
        if num_queries != num_database:
            raise ValueError(
                f"exclude_self needs queries == database, got {num_queries} vs {num_database} "
                "rows (use query_index for a query subset of the database)"
            )
        return torch.arange(num_queries)
    if exclude_self:
        raise ValueError("give exclude_self or query_index, not both")
    query_index = as_tensor(query_index, "query_index")
    if (
        query_index.dtype.is_floating_point
        or query_index.dtype.is_complex
        or query_index.dtype == torch.bool
    ):
        raise ValueError(f"query_index must be an integer tensor, got dtype {query_index.dtype}")
    if query_index.shape != (num_queries,):
        raise ValueError(
            f"query_index has shape {tuple(query_index.shape)}, expected ({num_queries},) "
            "(the database row of each query)"
        )
    query_index = query_index.long().cpu()
    if int(query_index.min()) < 0 or int(query_index.max()) >= num_database:
        raise ValueError(
            f"query_index out of range: values must be in [0, {num_database}), got "
            f"[{int(query_index.min())}, {int(query_index.max())}]"
        )
    if unique_sorted(query_index).numel() != num_queries:
        raise ValueError("query_index has duplicate values: two queries cannot be one database row")
    return query_index


def positive_pairs_from_labels(
    query_labels: Tensor, database_labels: Tensor, exclude_self: bool
) -> tuple[Tensor, Tensor]:
    """All (query, database) index pairs with equal labels, ordered by query.

    Assumes ``database_labels`` is sorted ascending (the engine sorts it).
    """
    lo = torch.searchsorted(database_labels, query_labels, right=False)
    hi = torch.searchsorted(database_labels, query_labels, right=True)
    counts = hi - lo
    q_idx = torch.repeat_interleave(torch.arange(query_labels.numel()), counts)
    starts = torch.repeat_interleave(lo - (torch.cumsum(counts, 0) - counts), counts)
    d_idx = torch.arange(q_idx.numel()) + starts
    if exclude_self:
        keep = q_idx != d_idx
        q_idx, d_idx = q_idx[keep], d_idx[keep]
    return q_idx, d_idx


def relevant_pairs_from_fn(
    relevance_fn, num_queries: int, num_database: int, block_size: int = 4096
) -> tuple[Tensor, Tensor]:
    """Sparse positives from a relevance function, evaluated block by block.

    Args:
        relevance_fn: ``fn(query_idx (R,), database_idx (C,)) -> (R, C) bool`` (True =
            relevant), called on CPU index blocks; never on the whole Q x D grid.
    Returns:
        ``(query_idx, database_idx)`` int64 index tensors of the relevant pairs.
    """
    q_parts, d_parts = [], []
    for r0 in range(0, num_queries, block_size):
        rows = torch.arange(r0, min(num_queries, r0 + block_size))
        for c0 in range(0, num_database, block_size):
            cols = torch.arange(c0, min(num_database, c0 + block_size))
            mask = torch.as_tensor(relevance_fn(rows, cols)).cpu()
            if mask.shape != (rows.numel(), cols.numel()) or mask.dtype != torch.bool:
                raise ValueError(
                    f"relevance_fn must return a bool ({rows.numel()}, {cols.numel()}) tensor, "
                    f"got {mask.dtype} {tuple(mask.shape)}"
                )
            i, j = mask.nonzero(as_tuple=True)
            q_parts.append(i + r0)
            d_parts.append(j + c0)
    return torch.cat(q_parts), torch.cat(d_parts)


def same_data(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors view the very same elements (e.g. one numpy array passed twice)."""
    return a is b or (
        a.device == b.device
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.data_ptr() == b.data_ptr()
    )


def check_rows(rows, size: int, name: str) -> Tensor | None:
    """Validated (N,) int64 CPU row indices into a tensor of ``size`` rows (or None)."""
    if rows is None:
        return None
    rows = as_tensor(rows, name)
    if rows.ndim != 1 or rows.dtype.is_floating_point or rows.dtype == torch.bool:
        raise ValueError(
            f"{name} must be a 1-D integer index, got {rows.dtype} {tuple(rows.shape)}"
        )
    rows = rows.long().cpu()
    if rows.numel() == 0:
        raise ValueError(f"{name} is empty")
    if int(rows.min()) < 0 or int(rows.max()) >= size:
        raise ValueError(f"{name} index out of range [0, {size})")
    return rows
