"""Counting negatives against the positive-score grid, block by block.

``NegativeCounter`` consumes blocks of *negative* scores (excluded pairs and
positives set to ``-inf``) for a range of query rows and keeps, exactly:

- per query group, the number of negatives >= every grid value (gAP, R@P, F1);
- per query, the number of its negatives >= each of its own positives (mAP,
  AP@k, R@k, per-query F1): a small histogram per query over its own distinct
  positive scores (m_q + 1 bins, O(P + Q) in all);
- optionally, per query, the negatives >= a set of bootstrap knots.

Per negative: one exact grid lookup ``g`` = #grid values <= score
(``GridLookup``: O(1) outside cells holding a positive), then the query's own
bin = #own distinct positives with grid position < g (a search among the
query's few positives), and histogram increments. A fused CPU kernel
(``native.py``) does the same in about one pass; the eager tensor path here (used
on GPU, for small blocks and without a compiler) computes the same counts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl_gap.metrics.functional import native
from rl_gap.metrics.functional import state as _state
from rl_gap.metrics.functional.state import GridLookup, unique_sorted

__all__ = ["NegativeCounter", "suffix_sum"]

NATIVE_MIN_PAIRS = 1 << 16  # smaller blocks use eager ops


def _histogram(keys: Tensor, size: int) -> Tensor:
    """Counts of ``keys`` (int64, all in [0, size)) in ``size`` bins. ``bincount`` on an
    accelerator reads its maximum back to the host; ``index_add_`` into a known size
    does not (integer sums: any order gives the same counts)."""
    if _state.on_host(keys):
        return torch.bincount(keys, minlength=size)
    out = torch.zeros(size, dtype=torch.long, device=keys.device)
    return out.index_add_(0, keys, torch.ones_like(keys))


def suffix_sum(hist: Tensor) -> Tensor:
    """Reverse cumulative sum along the last dim."""
    return torch.flip(torch.cumsum(torch.flip(hist, [-1]), -1), [-1])


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
        self.grid_size = size = grid.numel()
        self.query_group = query_group.to(device=device, dtype=torch.long).contiguous()
        self.num_groups = num_groups
        num_queries = pos_offsets.numel() - 1
        pos_offsets = pos_offsets.to(device)
        pos_grid_index = pos_grid_index.to(device)
        pos_query = torch.repeat_interleave(
            torch.arange(num_queries, device=device), pos_offsets[1:] - pos_offsets[:-1]
        )
        # Own distinct positives of each query, ascending grid position (CSR).
        key = pos_query * (size + 1) + pos_grid_index
        own_key = unique_sorted(key)
        own_query = own_key // (size + 1)
        self.own_index = (own_key % (size + 1)).contiguous()  # (U,)
        own_counts = torch.bincount(own_query, minlength=num_queries)
        self.own_offsets = torch.zeros(num_queries + 1, dtype=torch.long, device=device)
        self.own_offsets[1:] = torch.cumsum(own_counts, 0)
        # Host copy: block bounds and widths are read from it, not from the device.
        self._own_offsets_host = self.own_offsets.cpu()
        # Position of each positive among its query's own distinct values.
        self.pos_own = torch.searchsorted(own_key, key) - self.own_offsets[pos_query]
        self.pos_query = pos_query
        # Row histograms: query q owns bins [own_offsets[q] + q, own_offsets[q+1] + q + 1).
        self.row_hist = torch.zeros(own_key.numel() + num_queries, dtype=torch.long, device=device)
        self.global_hist = torch.zeros(num_groups * (size + 1), dtype=torch.long, device=device)
        self.boot_knot_index = None
        self.boot_width = 0
        if boot_knot_index is not None:
            self.boot_knot_index = boot_knot_index.to(device)
            self.boot_lut = torch.searchsorted(
                self.boot_knot_index, torch.arange(size + 1, device=device)
            )
            self.boot_width = self.boot_knot_index.numel() + 1
            self.boot_hist = torch.zeros(
                num_queries * self.boot_width, dtype=torch.long, device=device
            )
        self._thread_hists: Tensor | None = None  # native kernel: one global hist per thread
        self._table: native.CellTable | None = None
        self.force_native: bool | None = None  # None: by size policy; True/False: always/never

    def add(
        self,
        scores: Tensor,
        start: int,
        global_weight: int = 1,
        transposed: bool = False,
        mirror_start: int | None = None,
    ) -> None:
        """Count a block of negative scores of query rows ``start .. start + R``.

        Args:
            scores: (R, C) scores of negative pairs; pairs to ignore hold ``-inf``.
            start: query index of the block's first row.
            global_weight: 1 or 0 (skip the global histogram: per-query counts only).
            transposed: the block's *columns* are the queries ``start, start + 1, ...``.
            mirror_start: the block also stands for its transpose, whose rows are the
                queries ``mirror_start + j``: every score enters the global histogram
                for them too (their per-query counts come from a ``transposed`` call).
        """
        if global_weight not in (0, 1):
            raise ValueError(f"global_weight must be 0 or 1, got {global_weight}")
        if scores.numel() == 0:
            return
        if mirror_start is not None and self.num_groups == 1 and global_weight:
            # One group: the mirrored score counts twice for it, no per-column lookup.
            global_weight, mirror_start = 2, None
        if self._use_native(scores):
            self._add_native(scores, start, global_weight, transposed, mirror_start)
            return
        if transposed:
            scores = scores.T.contiguous()
        stop = start + scores.shape[0]
        counts = self.lookup.count_le(scores)  # (R, C) int64 in [0, G]
        if global_weight:
            width = self.grid_size + 1
            keys = counts + (self.query_group[start:stop] * width).unsqueeze(1)
            if mirror_start is not None:
                mirror = self.query_group[mirror_start : mirror_start + scores.shape[1]]
                keys = torch.cat([keys, counts + (mirror * width).unsqueeze(0)])
            self.global_hist += global_weight * _histogram(keys.view(-1), self.global_hist.numel())
        self._add_rows_eager(counts, start, stop)
        if self.boot_knot_index is not None:
            local = self.boot_lut[counts]
            local += (torch.arange(stop - start, device=local.device) * self.boot_width)[:, None]
            part = self.boot_hist[start * self.boot_width : stop * self.boot_width]
            part += _histogram(local.view(-1), part.numel())

    def _add_rows_eager(self, counts: Tensor, start: int, stop: int) -> None:
        """Per-row bins: #own distinct positives with grid position < g (batched search).
        Sizes come from the host copy of the offsets: no device read-back per block."""
        host = self._own_offsets_host
        lo, hi = int(host[start]), int(host[stop])
        num_own_host = host[start + 1 : stop + 1] - host[start:stop]
        width = int(num_own_host.max()) if num_own_host.numel() else 0
        if width == 0:
            return
        rows = stop - start
        device = counts.device
        num_own = num_own_host.to(device)
        # (R, width) own grid positions, padded with G + 1 (never < g).
        padded = torch.full((rows, width), self.grid_size + 1, dtype=torch.long, device=device)
        row_of = torch.repeat_interleave(
            torch.arange(rows, device=device), num_own, output_size=hi - lo
        )
        first_own = self.own_offsets[start:stop] - lo
        col_of = torch.arange(hi - lo, device=device) - torch.repeat_interleave(
            first_own, num_own, output_size=hi - lo
        )
        padded[row_of, col_of] = self.own_index[lo:hi]
        local = torch.searchsorted(padded, counts, right=False)  # #own positions < g
        base = first_own + torch.arange(rows, device=device)
        keys = local + base[:, None]
        size = hi - lo + rows
        self.row_hist[lo + start : lo + start + size] += _histogram(keys.view(-1), size)

    def _use_native(self, scores: Tensor) -> bool:
        if (
            scores.device.type != "cpu"
            or scores.dtype not in (torch.float32, torch.float64)
            or self.force_native is False
        ):
            return False
        if self.force_native is None and scores.numel() < NATIVE_MIN_PAIRS:
            return False
        return native.native_library() is not None

    def _add_native(
        self,
        scores: Tensor,
        start: int,
        global_weight: int,
        transposed: bool,
        mirror_start: int | None,
    ) -> None:
        threads = max(1, torch.get_num_threads())
        if self._thread_hists is None or self._thread_hists.shape[0] < threads:
            old = self._thread_hists
            self._thread_hists = torch.zeros(
                threads, self.global_hist.numel(), dtype=torch.long, device=scores.device
            )
            if old is not None:
                self._thread_hists[: old.shape[0]] += old
        if self._table is None:
            self._table = native.CellTable(self.lookup.grid)
        boot = self.boot_knot_index is not None
        scores = scores.contiguous()
        # The kernel counts a call in 32 bits (a mirrored score counts twice): keep
        # 2 x pairs per call below 2^31. Row slices add up exactly (for a transposed
        # block they split every query's column).
        step = max(1, (1 << 29) // max(1, scores.shape[1]))
        for r0 in range(0, scores.shape[0], step):
            native.count_block(
                scores[r0 : r0 + step], self._table, self.query_group, self._thread_hists,
                start if transposed else start + r0, self.own_index, self.own_offsets,
                self.row_hist, self.boot_lut if boot else None,
                self.boot_hist if boot else None, self.boot_width, global_weight, threads,
                transposed, mirror_start,
            )  # fmt: skip

    def merge(self, shard) -> None:
        """Sum the counts over the processes of a sharded evaluation (``sharding.py``);
        every process then holds the counts of every block."""
        from rl_gap.metrics.functional.sharding import merge_sum

        if self._thread_hists is not None:
            self.global_hist += self._thread_hists.sum(0)
            self._thread_hists = None
        parts = [self.global_hist, self.row_hist]
        if self.boot_knot_index is not None:
            parts.append(self.boot_hist)
        merge_sum(parts, shard)

    def finish(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """Returns ``(pos_neg_ge (P,), grid_neg_ge (groups, G), boot_neg_ge (Q, B) | None)``."""
        if self._thread_hists is not None:
            self.global_hist += self._thread_hists.sum(0)
            self._thread_hists = None
        hist = self.global_hist.view(self.num_groups, self.grid_size + 1)
        grid_neg_ge = suffix_sum(hist)[:, 1:]
        # Per query: negatives >= own value u = sum of the query's bins above u.
        row_start = self.own_offsets[:-1] + torch.arange(
            self.own_offsets.numel() - 1, device=self.row_hist.device
        )
        query_of_bin = torch.repeat_interleave(
            torch.arange(row_start.numel(), device=self.row_hist.device),
            self.own_offsets[1:] - self.own_offsets[:-1] + 1,
        )
        totals = torch.zeros(row_start.numel(), dtype=torch.long, device=self.row_hist.device)
        totals.index_add_(0, query_of_bin, self.row_hist)
        inclusive = torch.cumsum(self.row_hist, 0)  # running sum over all bins
        # bins of query q from bin index b to its end: totals[q] - (inclusive[b-1] - before_q)
        before_q = inclusive[row_start] - self.row_hist[row_start]
        bin_index = row_start[self.pos_query] + self.pos_own + 1
        below = inclusive[bin_index - 1] - before_q[self.pos_query]
        pos_neg_ge = totals[self.pos_query] - below
        boot = None
        if self.boot_knot_index is not None:
            boot = suffix_sum(self.boot_hist.view(-1, self.boot_width))[:, 1:]
        return pos_neg_ge, grid_neg_ge.contiguous(), boot
