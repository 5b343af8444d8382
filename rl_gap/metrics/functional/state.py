"""The exact, memory-bounded retrieval state every metric is computed from.

Ranking metrics with pessimistic ties (docs/definitions.md) only ever need, for each
positive pair ``i`` of query ``q``:

- ``pos_ge`` — positives of ``q`` scoring ``>= s_i``,
- ``neg_ge`` — negatives of ``q`` scoring ``>= s_i``,
- ``TP(s_i)`` / ``FP(s_i)`` — positives / negatives of *all* queries scoring ``>= s_i``.

Negatives are never stored: each one is looked up on the grid of distinct
positive scores (``G`` values) and counted, globally (per query group) and
per query at its own positives only. The state is therefore O(P + groups·G)
for P positive pairs, whatever the number of negatives.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "RetrievalState",
    "GridLookup",
    "tie_group_end",
    "compute_dtype_for",
    "argsort_stable",
    "unique_sorted",
    "torch_threads",
    "on_host",
]


def on_host(x: Tensor) -> bool:
    """Whether ``x`` is counted by the host (CPU) paths; False selects the
    accelerator paths, which read nothing back to the host per block."""
    return x.device.type == "cpu"


@contextmanager
def torch_threads(count: int):
    """Temporarily set torch's intra-op CPU threads.

    The engine's bookkeeping is many small ops; with cores oversubscribed,
    torch's thread pool made them ~40x slower than one thread (measured here),
    so everything but the GEMM and the counting kernel runs single-threaded.
    """
    old = torch.get_num_threads()
    if count == old:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# torch's parallel CPU sort/unique degrade badly when cores are oversubscribed
# (measured here: 0.7 s vs 0.01 s for 7e4 int64 with 2 threads under load), so
# CPU tensors go through numpy, which sorts single-threaded.
def argsort_stable(x: Tensor, descending: bool = False) -> Tensor:
    """Stable argsort of a 1-D tensor (ties keep their input order)."""
    if x.device.type != "cpu":
        return torch.argsort(x, descending=descending, stable=True)
    values = x.numpy()
    if descending:
        values = -values if x.dtype.is_floating_point else -(values.astype(np.int64))
    return torch.from_numpy(np.argsort(values, kind="stable"))


def unique_sorted(x: Tensor, return_inverse: bool = False):
    """Sorted distinct values of a 1-D tensor (and the inverse index)."""
    if x.device.type != "cpu":
        return torch.unique(x, sorted=True, return_inverse=return_inverse)
    if return_inverse:
        values, inverse = np.unique(x.numpy(), return_inverse=True)
        return torch.from_numpy(values), torch.from_numpy(inverse.astype(np.int64))
    values = x.numpy()
    if values.dtype.kind not in "biu":
        return torch.from_numpy(np.unique(values))
    # Integers: sort + adjacent-difference mask. numpy >= 2.3 answers np.unique
    # with a hash table here, ~30x slower than sorting (1.1 s vs 0.04 s for the
    # 1.25M own-positive keys of a 2,500-query leave-one-out evaluation).
    values = np.sort(values)
    if values.size > 1:
        values = values[np.concatenate(([True], values[1:] != values[:-1]))]
    return torch.from_numpy(values)


def compute_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """Scoring dtype: float16/bfloat16 are promoted to float32; float32/float64 kept."""
    if dtype == torch.float64:
        return torch.float64
    if dtype in (torch.float32, torch.float16, torch.bfloat16):
        return torch.float32
    if dtype.is_floating_point:
        return torch.float32
    raise ValueError(f"scores/embeddings must be floating point, got dtype {dtype}")


def tie_group_end(keys: list[Tensor]) -> Tensor:
    """For a sequence sorted so that equal key tuples are adjacent, the index of the
    last element of each element's run of equal keys (shape like ``keys[0]``)."""
    n = keys[0].numel()
    device = keys[0].device
    if n == 0:
        return torch.zeros(0, dtype=torch.long, device=device)
    boundary = torch.zeros(n, dtype=torch.bool, device=device)
    boundary[-1] = True
    for key in keys:
        boundary[:-1] |= key[1:] != key[:-1]
    idx = torch.arange(n, device=device)
    # Last index of each run = nearest boundary at or after the position.
    big = torch.full_like(idx, n)
    ends = torch.where(boundary, idx, big)
    return torch.flip(torch.cummin(torch.flip(ends, [0]), 0).values, [0])


class GridLookup:
    """Exact ``count of grid values <= x`` in O(1) per element.

    A uniform grid of ``num_cells`` cells over ``[grid[0], grid[-1]]`` gives each
    score a cell; the cell map ``x -> floor((x - lo) * scale)`` is monotone and
    computed with the very same tensor ops for the grid values and the scores, so a
    grid value in a lower (higher) cell is certainly <= (>) the score. Only scores
    landing in a cell that holds a grid value are refined by an exact
    ``searchsorted`` (docs/metrics_engine.md: a binary search per pair would cost 5-50x the GEMM).

    Args:
        grid: (G,) ascending distinct finite values (the positive scores), G >= 1.
        num_cells: uniform cells; default ~2-4 per grid value, within [2^10, 2^22]
            (a small table stays in cache; occupied cells hold ~1 value).
    """

    def __init__(self, grid: Tensor, num_cells: int | None = None) -> None:
        if grid.ndim != 1 or grid.numel() == 0:
            raise ValueError("GridLookup needs a non-empty 1-D grid")
        self.grid = grid.contiguous()
        size = grid.numel()
        if num_cells is None:
            num_cells = min(max(1 << 10, 1 << int(2 * size - 1).bit_length()), 1 << 22)
        self.num_cells = int(num_cells)
        self.lo = grid[0].clone()
        span = (grid[-1] - grid[0]).item()
        scale = self.num_cells / span if span > 0 else 1.0
        if not torch.isfinite(torch.tensor(scale)):
            scale = 1.0
        self.scale = torch.tensor(scale, dtype=grid.dtype, device=grid.device)
        cells = self.cell(grid)
        counts = torch.bincount(cells, minlength=self.num_cells + 2)
        self.occupied = counts > 0
        base = torch.cumsum(counts, 0) - counts
        index_dtype = torch.int32 if size < 2**31 - 1 else torch.int64
        self.base = base.to(index_dtype)
        # base with a closing entry G: cell c holds grid positions [bounds[c], bounds[c+1]).
        self.bounds = torch.cat([base, base.new_full((1,), size)]).to(index_dtype)

    def cell(self, x: Tensor) -> Tensor:
        """Cell index in [0, num_cells + 1] (0: below the grid, last: at/after its top)."""
        scaled = (x - self.lo) * self.scale
        scaled = scaled.clamp_(-1.0, float(self.num_cells)).floor_()
        return scaled.long() + 1

    def count_le(self, x: Tensor) -> Tensor:
        """``#{grid values <= x}`` for every element of ``x`` (int64, same shape)."""
        if not on_host(x):
            # On an accelerator one search per element is cheap, and the cell path's
            # masked refinement would wait for the host twice per block.
            return torch.searchsorted(self.grid, x.contiguous(), right=True)
        cells = self.cell(x)
        counts = self.base[cells].long()
        refine = self.occupied[cells]
        if bool(refine.any()):
            counts[refine] = torch.searchsorted(self.grid, x[refine].contiguous(), right=True)
        return counts


@dataclass
class RetrievalState:
    """Sufficient statistics of a retrieval problem for exact ranking metrics.

    Positive pairs are ordered by query, then by decreasing score.

    Attributes:
        num_queries: Q, including distractor queries (no positive).
        pos_scores: (P,) positive-pair scores (the scoring dtype, exact).
        pos_query: (P,) int64 query index of each positive.
        pos_neg_ge: (P,) int64 negatives of the same query scoring >= the positive.
        grid: (G,) ascending distinct positive scores.
        pos_grid_index: (P,) int64 position of each positive's score in ``grid``.
        grid_neg_ge: (n_groups, G) int64 negatives, over the queries of each
            group, scoring >= each grid value.
        query_group: (Q,) int64 group of each query (one group unless a split asks
            for more, e.g. the threshold protocol).
        num_negatives: (Q,) int64 valid negative pairs per query.
        boot_knot_index: optional (B,) int64 grid indices where per-query
            negative counts are kept for the gAP bootstrap.
        boot_neg_ge: optional (Q, B) int64 per-query negatives >= each knot.
    """

    num_queries: int
    pos_scores: Tensor
    pos_query: Tensor
    pos_neg_ge: Tensor
    grid: Tensor
    pos_grid_index: Tensor
    grid_neg_ge: Tensor
    query_group: Tensor
    num_negatives: Tensor
    boot_knot_index: Tensor | None = None
    boot_neg_ge: Tensor | None = None
    extras: dict = field(default_factory=dict)

    @property
    def num_positives(self) -> Tensor:
        """(Q,) int64 positives per query."""
        return torch.bincount(self.pos_query, minlength=self.num_queries)

    @property
    def pos_pos_ge(self) -> Tensor:
        """(P,) int64 positives of the same query scoring >= each positive (ties counted)."""
        if self.pos_scores.numel() == 0:
            return torch.zeros(0, dtype=torch.long, device=self.pos_scores.device)
        ends = tie_group_end([self.pos_query, self.pos_scores])
        starts = torch.cumsum(self.num_positives, 0) - self.num_positives
        return ends - starts[self.pos_query] + 1

    def to(self, device: torch.device | str) -> RetrievalState:
        """Copy of the state with every tensor on ``device``."""
        moved = {}
        for name, value in self.__dict__.items():
            moved[name] = value.to(device) if isinstance(value, Tensor) else value
        return RetrievalState(**moved)
