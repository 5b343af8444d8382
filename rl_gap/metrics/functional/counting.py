"""Counting negatives against the positive-score grid, block by block.

``NegativeCounter`` consumes blocks of *negative* scores (excluded pairs and
positives set to ``-inf``) for a range of query rows and keeps, exactly:

- per query group, the number of negatives >= every grid value (gAP, R@P, F1);
- per query, the number of its negatives >= each of its own positives (mAP,
  AP@k, R@k, per-query F1), through a row-chunk histogram over the union of the
  chunk's own positive grid positions (rows sorted by label share that union);
- optionally, per query, the negatives >= a set of bootstrap knots.

Work per negative is O(1): one grid lookup (``GridLookup``) plus table gathers
and ``bincount``; memory is O(groups·G + P + chunk histograms).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl_gap.metrics.functional.state import GridLookup

__all__ = ["NegativeCounter"]

_LOCAL_BUDGET = 1 << 20  # entries of one row-chunk histogram


def _suffix_sum(hist: Tensor) -> Tensor:
    """Reverse cumulative sum along the last dim."""
    return torch.flip(torch.cumsum(torch.flip(hist, [-1]), -1), [-1])


class _RowChunk:
    """Rows [start, stop) with the union of their own positives' grid positions."""

    def __init__(self, start: int, stop: int, union: Tensor, grid_size: int) -> None:
        self.start, self.stop = start, stop
        self.union = union
        width = union.numel() + 1
        self.width = width
        # lut[g] = #union positions < g, i.e. #own-union values <= a score with count_le = g.
        self.lut = torch.searchsorted(
            union, torch.arange(grid_size + 1, device=union.device), right=False
        )
        self.hist = torch.zeros((stop - start) * width, dtype=torch.long, device=union.device)


class NegativeCounter:
    """Accumulates exact negative counts on the grid of distinct positive scores.

    Args:
        grid: (G,) ascending distinct positive scores (scoring dtype), G >= 1.
        pos_offsets: (Q+1,) CSR offsets of the positives, grouped by query.
        pos_grid_index: (P,) grid position of each positive.
        query_group: (Q,) int64 group of each query; ``num_groups`` groups.
        boot_knot_index: optional (B,) ascending grid positions for per-query
            bootstrap counts.
    """

    def __init__(
        self,
        grid: Tensor,
        pos_offsets: Tensor,
        pos_grid_index: Tensor,
        query_group: Tensor,
        num_groups: int,
        boot_knot_index: Tensor | None = None,
    ) -> None:
        device = grid.device
        self.lookup = GridLookup(grid)
        self.grid_size = grid.numel()
        self.pos_offsets = pos_offsets.to(device)
        self.pos_grid_index = pos_grid_index.to(device)
        self.query_group = query_group.to(device)
        self.num_groups = num_groups
        num_queries = pos_offsets.numel() - 1
        self.global_hist = torch.zeros(
            num_groups * (self.grid_size + 1), dtype=torch.long, device=device
        )
        self.pos_neg_ge = torch.zeros(pos_grid_index.numel(), dtype=torch.long, device=device)
        self.boot_knot_index = None
        if boot_knot_index is not None:
            self.boot_knot_index = boot_knot_index.to(device)
            self.boot_lut = torch.searchsorted(
                self.boot_knot_index, torch.arange(self.grid_size + 1, device=device)
            )
            self.boot_width = self.boot_knot_index.numel() + 1
            self.boot_hist = torch.zeros(
                num_queries * self.boot_width, dtype=torch.long, device=device
            )
        self._chunks: list[_RowChunk] = []
        self._rows: tuple[int, int] | None = None

    # ----------------------------------------------------------------- rows
    def begin_rows(self, start: int, stop: int) -> None:
        """Start a range of query rows; ``add`` then takes their score blocks."""
        if self._rows is not None:
            self.end_rows()
        self._rows = (start, stop)
        self._chunks = []
        offsets = self.pos_offsets.tolist()
        positions = self.pos_grid_index

        def union_of(lo_row: int, hi_row: int) -> Tensor:
            return torch.unique(positions[offsets[lo_row] : offsets[hi_row]])

        row = start
        while row < stop:
            # Galloping growth of the chunk while its histogram fits the budget.
            end, step = row + 1, 1
            while end < stop and step >= 1:
                trial = min(stop, end + step)
                if (trial - row) * (union_of(row, trial).numel() + 1) <= _LOCAL_BUDGET:
                    end, step = trial, step * 2
                else:
                    step //= 2
            self._chunks.append(_RowChunk(row, end, union_of(row, end), self.grid_size))
            row = end

    def add(self, scores: Tensor) -> None:
        """Count a block of negative scores (rows = the current row range).

        Args:
            scores: (R, C) scores of negative pairs; pairs to ignore hold ``-inf``.
        """
        if self._rows is None:
            raise RuntimeError("NegativeCounter.add called outside begin_rows/end_rows")
        start, stop = self._rows
        if scores.shape[0] != stop - start:
            raise ValueError(f"block has {scores.shape[0]} rows, expected {stop - start}")
        if scores.numel() == 0:
            return
        counts = self.lookup.count_le(scores)  # (R, C) int64 in [0, G]
        width = self.grid_size + 1
        if self.num_groups == 1:
            self.global_hist += torch.bincount(counts.view(-1), minlength=width)
        else:
            keys = counts + (self.query_group[start:stop] * width).unsqueeze(1)
            self.global_hist += torch.bincount(keys.view(-1), minlength=self.global_hist.numel())
        for chunk in self._chunks:
            rows = slice(chunk.start - start, chunk.stop - start)
            local = chunk.lut[counts[rows]]
            local += (torch.arange(chunk.stop - chunk.start, device=local.device) * chunk.width)[
                :, None
            ]
            chunk.hist += torch.bincount(local.view(-1), minlength=chunk.hist.numel())
        if self.boot_knot_index is not None:
            local = self.boot_lut[counts]
            local += (torch.arange(stop - start, device=local.device) * self.boot_width)[:, None]
            part = self.boot_hist[start * self.boot_width : stop * self.boot_width]
            part += torch.bincount(local.view(-1), minlength=part.numel())

    def end_rows(self) -> None:
        """Turn the row-chunk histograms into per-positive negative counts."""
        if self._rows is None:
            return
        for chunk in self._chunks:
            lo = int(self.pos_offsets[chunk.start])
            hi = int(self.pos_offsets[chunk.stop])
            if hi > lo:
                ge = _suffix_sum(chunk.hist.view(chunk.stop - chunk.start, chunk.width))
                rows = torch.repeat_interleave(
                    torch.arange(chunk.stop - chunk.start, device=ge.device),
                    self.pos_offsets[chunk.start + 1 : chunk.stop + 1]
                    - self.pos_offsets[chunk.start : chunk.stop],
                )
                where = torch.searchsorted(chunk.union, self.pos_grid_index[lo:hi])
                self.pos_neg_ge[lo:hi] += ge[rows, where + 1]
        self._chunks = []
        self._rows = None

    # ---------------------------------------------------------------- finish
    def finish(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """Returns ``(pos_neg_ge (P,), grid_neg_ge (groups, G), boot_neg_ge (Q, B) | None)``."""
        self.end_rows()
        hist = self.global_hist.view(self.num_groups, self.grid_size + 1)
        grid_neg_ge = _suffix_sum(hist)[:, 1:]
        boot = None
        if self.boot_knot_index is not None:
            boot = _suffix_sum(self.boot_hist.view(-1, self.boot_width))[:, 1:]
        return self.pos_neg_ge, grid_neg_ge.contiguous(), boot
