"""Score blocks of the engine: embeddings read block by block into recycled buffers.

Every block of rows is gathered into one buffer per side that is reused for the
next block, and every score block the engine does not keep is written into one
recycled output buffer. A database that is memory-mapped (or float16, or on
another device) is therefore never copied whole, and the memory the engine
allocates per block does not grow with the number of blocks: freed per-block
tensors of a few MB are otherwise kept by the C allocator (a 2.4 GB memory-mapped
database grew the process by ~2 GB).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl_gap.metrics.functional.engine_plan import Plan
from rl_gap.metrics.functional.state import torch_threads
from rl_gap.precision import autocast_disabled

__all__ = ["BlockReader", "BlockScorer", "mirror_upper"]

# Columns of a diagonal block mirrored per step (the temporary is one small tile).
_MIRROR_STRIP = 256


def mirror_upper(block: Tensor) -> None:
    """Copy the upper triangle of a square block onto its lower one, in place.

    A GEMM's rounding depends on its shape and on an element's place in it, so
    ``A @ A.T`` need not be symmetric; leave-one-out needs s(i, j) and s(j, i) to
    be one value (one tie), as the blocks off the diagonal already are (mirrored).
    """
    n = block.shape[0]
    for c0 in range(0, n, _MIRROR_STRIP):
        c1 = min(n, c0 + _MIRROR_STRIP)
        block[c1:, c0:c1].copy_(block[c0:c1, c1:].T)
        tile = block[c0:c1, c0:c1]
        tile.copy_(tile.triu() + tile.triu(1).T)  # x + 0 is x: the upper values, exactly


class BlockReader:
    """Rows ``order[start:stop]`` of ``source`` on ``device`` in ``dtype``, in a recycled buffer.

    A block is valid until the next ``read``. Without ``order`` (rows in place) a
    block that needs no conversion is a view of ``source`` itself. ``normalize``:
    each row is L2-normalised in the buffer (``F.normalize`` of the converted rows:
    the values of normalising the whole source first, without its copy).
    """

    def __init__(
        self,
        source: Tensor,
        order: Tensor | None,
        device: torch.device,
        dtype: torch.dtype,
        max_rows: int,
        normalize: bool = False,
    ) -> None:
        # detached: ``out=`` gathers refuse tensors that require grad
        self.source, self.device, self.dtype = source.detach(), device, dtype
        self.order = None if order is None else order.to(source.device)
        self.max_rows, self.width = max_rows, source.shape[1]
        # Read once: every access to the source counts as a read of it (torch functions).
        self.source_dtype, self.source_device = source.dtype, source.device
        self.normalize = normalize
        self.converts = source.dtype != dtype or source.device != device or normalize
        self._gathered: Tensor | None = None  # rows in the source's dtype and device
        self._converted: Tensor | None = None  # rows in the scoring dtype and device

    def _buffer(self, name: str, dtype: torch.dtype, device: torch.device) -> Tensor:
        buffer = getattr(self, name)
        if buffer is None:
            buffer = torch.empty((self.max_rows, self.width), dtype=dtype, device=device)
            setattr(self, name, buffer)
        return buffer

    def read(self, start: int, stop: int) -> Tensor:
        """Block of rows ``start..stop`` (at most ``max_rows``) ready to score."""
        if self.order is None:
            rows = self.source[start:stop]
            if not self.converts:
                return rows
        else:
            gathered = self._buffer("_gathered", self.source_dtype, self.source_device)
            rows = gathered[: stop - start]
            torch.index_select(self.source, 0, self.order[start:stop], out=rows)
            if not self.converts:
                return rows
        converted = self._buffer("_converted", self.dtype, self.device)[: stop - start]
        converted.copy_(rows)
        if self.normalize:
            torch.nn.functional.normalize(converted, dim=1, out=converted)
        return converted


class BlockScorer:
    """Score blocks ``queries[r0:r1] . database[c0:c1]`` (sorted positions) of a plan.

    The query side and the database side each read through their own ``BlockReader``
    (leave-one-out on one set reads both from the database, as the scores are
    symmetric); the outer block of a loop is read once per change of block.
    """

    def __init__(self, plan: Plan, heavy_threads: int = 1) -> None:
        self.plan = plan
        self.heavy_threads = heavy_threads
        rows = min(plan.rows_step, plan.num_queries)
        cols = min(plan.cols_step, plan.num_database)
        if plan.symmetric:
            self.query_reader = BlockReader(
                plan.database, plan.d_order, plan.device, plan.dtype, rows, plan.normalize
            )
        else:
            self.query_reader = BlockReader(
                plan.queries, plan.q_source, plan.device, plan.dtype, rows, plan.normalize
            )
        self.database_reader = BlockReader(
            plan.database, plan.d_order, plan.device, plan.dtype, cols, plan.normalize
        )
        self._out: Tensor | None = None
        self._out_size = rows * cols
        self._query_key: int | None = None
        self._database_key: int | None = None
        self._query_block: Tensor | None = None
        self._database_block: Tensor | None = None

    def _query(self, r0: int, r1: int) -> Tensor:
        if self._query_key != r0:
            self._query_block, self._query_key = self.query_reader.read(r0, r1), r0
        return self._query_block

    def _database(self, c0: int, c1: int) -> Tensor:
        if self._database_key != c0:
            self._database_block, self._database_key = self.database_reader.read(c0, c1), c0
        return self._database_block

    def score(self, r0: int, r1: int, c0: int, c1: int, keep: bool = False) -> Tensor:
        """Scores of the block (query offsets subtracted). ``keep=False`` writes them into
        the recycled output buffer, valid until the next such call; ``keep=True``
        returns a fresh tensor the caller may hold."""
        plan = self.plan
        q_blk, d_blk = self._query(r0, r1), self._database(c0, c1)
        with torch_threads(self.heavy_threads), autocast_disabled(plan.device):
            if keep:
                out = q_blk @ d_blk.T
            else:
                if self._out is None:
                    self._out = torch.empty(self._out_size, dtype=plan.dtype, device=plan.device)
                out = self._out[: (r1 - r0) * (c1 - c0)].view(r1 - r0, c1 - c0)
                torch.mm(q_blk, d_blk.T, out=out)
            if plan.q_shift is not None:
                out.sub_(plan.q_shift[r0:r1, None])
        if plan.symmetric and r0 == c0:
            mirror_upper(out)  # on the bookkeeping thread: threads slow its small copies
        return out

    def mask_self(self, block: Tensor, r0: int, r1: int, c0: int) -> None:
        """Set each query's self pair inside block (r0.., c0..) to ``-inf``."""
        if self.plan.self_col is None:
            return
        cols = self.plan.self_col[r0:r1]
        rows = ((cols >= c0) & (cols < c0 + block.shape[1])).nonzero(as_tuple=True)[0]
        if rows.numel():
            block[rows.to(block.device), (cols[rows] - c0).to(block.device)] = float("-inf")
