"""Blocks of query rows: a prediction's per-positive arrays, a block of queries at a time.

The per-positive estimators (``count``, ``evt``, ``evt_support``) and the
sample's own metric treat each query on its own, so their (Q, m) and (Q, T)
temporaries can be made a block of rows at a time. A prediction on many
queries with many positives each (leave-one-out on a labelled set: Q · k
values per array) then holds a few full arrays and a block's temporaries,
not tens of full arrays. Inputs that fit one block run as one block.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rl_gap.metrics.tail.view import TailView

#: Values per (rows × width) array of one block (float64: 16 MiB).
ROW_BLOCK_VALUES = 1 << 21


def row_slices(n_rows: int, width: int, block_values: int | None = None) -> list[slice]:
    """Consecutive row slices of at most ``block_values // width`` rows (one slice if all fit;
    default :data:`ROW_BLOCK_VALUES`)."""
    block_values = ROW_BLOCK_VALUES if block_values is None else block_values
    rows = max(1, block_values // max(int(width), 1))
    return [slice(start, min(n_rows, start + rows)) for start in range(0, max(n_rows, 1), rows)]


class RowView:
    """Rows ``rows`` of a :class:`~rl_gap.metrics.tail.view.TailView`: a ``view.RowBlock``."""

    def __init__(self, parent: TailView, rows: slice) -> None:
        self.parent, self.rows = parent, rows
        self.pos_sorted = parent.pos_sorted[rows]
        self.valid = parent.valid[rows]
        self.j = parent.j[rows]
        self.query_ok = parent.query_ok[rows]
        self.k, self.config, self.bayes = parent.k, parent.config, parent.bayes
        self.sample_size = parent.sample_size

    def level(self, index: int = -1) -> tuple[torch.Tensor, int]:
        """These rows of nested level ``index``."""
        return self.parent.level_rows(index, self.rows)

    def level_size(self, index: int = -1) -> int:
        return self.parent.level_size(index)

    def row_views(self) -> None:
        return None  # already one block

    def weight(self, weight: torch.Tensor | None) -> torch.Tensor | None:
        return None if weight is None else weight[self.rows]


def concat_rows(parts: list):
    """Row blocks' results joined: tensors along rows, dataclasses field by field, None kept."""
    first = parts[0]
    if first is None or isinstance(first, int | float | str):
        return first  # the same for every block (a sample size), or absent
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if isinstance(first, tuple):
        return tuple(concat_rows(list(column)) for column in zip(*parts))
    fields = {
        f.name: concat_rows([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(first)
    }
    return type(first)(**fields)


def fill_rows(n_rows: int, blocks):
    """``concat_rows`` of ``(rows, result)`` pairs, tensors written into preallocated outputs
    (one full copy at a time, not the blocks and their concatenation)."""
    out, small = None, []
    for rows, result in blocks:
        items = result if isinstance(result, tuple) else (result,)
        if out is None:
            out = [
                torch.empty((n_rows, *t.shape[1:]), dtype=t.dtype)
                if isinstance(t, torch.Tensor)
                else None
                for t in items
            ]
        for i, t in enumerate(items):
            if isinstance(t, torch.Tensor):
                out[i][rows] = t
        small.append(tuple(None if isinstance(t, torch.Tensor) else t for t in items))
    joined = [o if o is not None else concat_rows([s[i] for s in small]) for i, o in enumerate(out)]
    return tuple(joined) if isinstance(result, tuple) else joined[0]
