"""Fused CPU counting kernel for ``NegativeCounter`` (optional; built on first use).

``native_count.cpp`` is a plain C-ABI library built on first use and loaded
with ctypes (``rl_gap.native_build``: about a second, cached in
``~/.cache/rl_gap``). Why it exists: the eager tensor path costs ~10 passes and
several scatters over every block, several times the GEMM (docs/metrics_engine.md); the
kernel does one vectorised pass plus one lookup and one increment per score
above the grid's lowest cell.

``RL_GAP_NATIVE=0`` disables it; without it the eager path gives identical
results (tests compare them).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import Tensor

from rl_gap.native_build import NativeLibrary

__all__ = ["native_enabled", "native_library", "CellTable", "count_block", "ISA_LEVELS", "set_isa"]

# Instruction-set paths of the kernel, slowest first (it picks the best the CPU has).
ISA_LEVELS = ("scalar", "avx2", "avx512")


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
    for suffix in ("f32", "f64"):
        getattr(lib, f"rl_gap_build_{suffix}").argtypes = [p, i64, i64, p, p]
        getattr(lib, f"rl_gap_count_{suffix}").argtypes = (
            [p, i64, i64, i32, p, i64, p, p, i64, p, p, i64, i64, p, p, p, p, p, i64, i32,
             i64, ctypes.c_int]
        )  # fmt: skip
    lib.rl_gap_set_isa.argtypes = [ctypes.c_int]
    lib.rl_gap_set_isa.restype = ctypes.c_int


_LIBRARY = NativeLibrary(
    Path(__file__).with_name("native_count.cpp"), "rl_gap_count", _declare,
    what="native counting kernel",
)  # fmt: skip
native_enabled = _LIBRARY.enabled
native_library = _LIBRARY.load


def set_isa(isa: str | None = None) -> str:
    """Make the kernel use the ``isa`` path (one of ``ISA_LEVELS``), or the best this
    CPU runs (None); a path the CPU lacks gives the best below it. Returns the path
    now in use. Every path gives the same counts (the tests run each)."""
    if isa is not None and isa not in ISA_LEVELS:
        raise ValueError(f"isa must be one of {ISA_LEVELS} or None, got {isa!r}")
    lib = native_library()
    if lib is None:
        raise RuntimeError("native kernel unavailable")
    return ISA_LEVELS[lib.rl_gap_set_isa(-1 if isa is None else ISA_LEVELS.index(isa))]


def _suffix(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return "f32"
    if dtype == torch.float64:
        return "f64"
    raise ValueError(f"native kernel needs float32/float64 scores, got {dtype}")


class CellTable:
    """The kernel's uniform-cell table over a grid of distinct ascending values."""

    def __init__(self, grid: Tensor) -> None:
        lib = native_library()
        if lib is None:
            raise RuntimeError("native kernel unavailable")
        size = grid.numel()
        # +inf after the last value: the kernel compares with grid[base] unguarded.
        self.grid = torch.cat([grid, grid.new_full((1,), float("inf"))]).contiguous()
        self.size = size
        self.suffix = _suffix(grid.dtype)
        self.num_cells = min(max(1 << 10, 1 << int(size - 1).bit_length()), 1 << 22)
        self.table = torch.empty(self.num_cells + 2, dtype=torch.int32)
        self.lo_scale = torch.empty(2, dtype=grid.dtype)
        getattr(lib, f"rl_gap_build_{self.suffix}")(
            self.grid.data_ptr(), size, self.num_cells, self.table.data_ptr(),
            self.lo_scale.data_ptr(),
        )  # fmt: skip


def count_block(
    scores: Tensor,
    table: CellTable,
    query_group: Tensor,
    thread_hists: Tensor,
    row_start: int,
    own_index: Tensor,
    own_offsets: Tensor,
    row_hist: Tensor,
    boot_lut: Tensor | None,
    boot_hist: Tensor | None,
    boot_width: int,
    global_weight: int,
    threads: int,
    transposed: bool = False,
    mirror_start: int | None = None,
) -> None:
    """Count one (R, C) block of negative scores in place (see ``NegativeCounter``).

    Rows are queries ``row_start, row_start + 1, ...``; with ``transposed`` the
    columns are (the block holds their scores as its columns). ``thread_hists`` is
    (>= threads, groups·(G+1)) int64; ``global_weight`` 0 skips the global
    histogram (own counts only); ``mirror_start`` also counts every score globally
    for the column query ``mirror_start + j`` (the block stands for its transpose).
    """
    lib = native_library()
    if scores.dtype != table.grid.dtype or not scores.is_contiguous():
        raise ValueError("count_block needs contiguous scores of the grid's dtype")
    empty = thread_hists[:0]
    fn = getattr(lib, f"rl_gap_count_{table.suffix}")
    fn(
        scores.data_ptr(), scores.shape[0], scores.shape[1], int(transposed),
        table.lo_scale.data_ptr(),
        table.num_cells, table.table.data_ptr(), table.grid.data_ptr(), table.size,
        query_group.data_ptr(), thread_hists.data_ptr(), thread_hists.shape[1], row_start,
        own_index.data_ptr(), own_offsets.data_ptr(), row_hist.data_ptr(),
        (boot_lut if boot_lut is not None else empty).data_ptr(),
        (boot_hist if boot_hist is not None else empty).data_ptr(),
        boot_width, int(global_weight), -1 if mirror_start is None else int(mirror_start),
        max(1, min(threads, thread_hists.shape[0])),
    )  # fmt: skip
