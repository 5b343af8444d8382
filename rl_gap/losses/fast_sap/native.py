"""Optional CPU accelerator for the O(M) passes of the fast smoothed AP (built on first use).

``native_sap_passes.cpp`` is a plain C-ABI library built on first use and
loaded with ctypes (``rl_gap.native_build``). It does the binning + moment
accumulation (forward) and the binning + per-item polynomial (backward) in
one pass each, where the torch path (``binning``) needs ~15 chunked
elementwise passes plus scatters and gathers. Cells and offsets are
bit-identical to the torch path; moment sums agree to float64 rounding (the
summation order differs), per-item polynomials to float rounding (torch may fuse a
multiply-add that the library keeps separate).

Used only for contiguous CPU float32/float64 scores whose dtype is the
plan's binning dtype; everything else (CUDA, half precision) runs the torch
path, as does ``RL_GAP_NATIVE=0`` or a machine without a compiler.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from rl_gap.native_build import BASE_FLAGS, NativeLibrary

# Tables smaller than this get several replicas per thread (see the .cpp).
SMALL_TABLE_BYTES = 1 << 16
SMALL_TABLE_COPIES = 4
# Threads of the negative-dropping passes (see drop_mask).
DROP_MAX_THREADS = 16


def _flags() -> list[str]:
    """Compiler flags; AVX2 code when torch found the CPU capable of it (no FMA either way:
    -ffp-contract=off keeps every product and sum separately rounded, as in the torch path)."""
    avx2 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    flags = [*BASE_FLAGS, "-fno-math-errno"]
    return [*flags, "-mavx2"] if avx2 else flags


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.rl_gap_fast_select.argtypes = [p, p, i64, p, i64]
    lib.rl_gap_fast_select.restype = i64
    for suffix in ("f32", "f64"):
        getattr(lib, f"rl_gap_fast_moments_{suffix}").argtypes = [
            p, p, i64, p, i32, i64, i64, i32, p, i32
        ]  # fmt: skip
        getattr(lib, f"rl_gap_fast_evaluate_{suffix}").argtypes = [
            p, p, i64, p, i32, i64, p, p, i32
        ]  # fmt: skip
        getattr(lib, f"rl_gap_fast_moments_{suffix}").restype = None
        getattr(lib, f"rl_gap_fast_evaluate_{suffix}").restype = None
        getattr(lib, f"rl_gap_fast_drop_{suffix}").argtypes = [
            p, p, p, i64, ctypes.c_double, p, i32
        ]  # fmt: skip
        getattr(lib, f"rl_gap_fast_drop_{suffix}").restype = i64
        getattr(lib, f"rl_gap_fast_drop_histogram_{suffix}").argtypes = [
            p, p, p, i64, i32, ctypes.c_uint64, p, i32
        ]  # fmt: skip
        getattr(lib, f"rl_gap_fast_drop_histogram_{suffix}").restype = None
        getattr(lib, f"rl_gap_fast_drop_mark_{suffix}").argtypes = [
            p, p, p, i64, ctypes.c_uint64, i64, p, i32
        ]  # fmt: skip
        getattr(lib, f"rl_gap_fast_drop_mark_{suffix}").restype = i64


_LIBRARY = NativeLibrary(
    Path(__file__).with_name("native_sap_passes.cpp"),
    "rl_gap_sap_passes",
    _declare,
    _flags,
    what="smoothed-AP passes library",
)
native_enabled = _LIBRARY.enabled
native_library = _LIBRARY.load


def usable(scores: torch.Tensor, bin_dtype: torch.dtype, valid: torch.Tensor | None) -> bool:
    """Whether the native passes apply to these inputs (else the torch path runs)."""
    return (
        scores.device.type == "cpu"
        and scores.dtype == bin_dtype
        and bin_dtype in (torch.float32, torch.float64)
        and scores.is_contiguous()
        and (valid is None or valid.is_contiguous())
        and native_library() is not None
    )


def select(positive: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor | None:
    """Ascending flat indices of ``positive & valid`` (int64), or None if the library is unusable.

    One pass over the masks (torch's ``nonzero`` makes two and costs ~4x more).
    """
    if (
        positive.device.type != "cpu"
        or not positive.is_contiguous()
        or (valid is not None and not valid.is_contiguous())
    ):
        return None
    lib = native_library()
    if lib is None:
        return None
    valid_ptr = None if valid is None else valid.data_ptr()
    count = lib.rl_gap_fast_select(positive.data_ptr(), valid_ptr, positive.numel(), None, 0)
    out = torch.empty(count, dtype=torch.int64)
    lib.rl_gap_fast_select(positive.data_ptr(), valid_ptr, positive.numel(), out.data_ptr(), count)
    return out


def grid_constants(inv_h: float, lo_cells: float, h_fine: float, first_centre: float, top: int):
    """The (5,) float64 tensor of binning constants the library reads."""
    return torch.tensor([inv_h, lo_cells, h_fine, first_centre, float(top)], dtype=torch.float64)


def _pass(lib, name: str, scores: torch.Tensor, valid: torch.Tensor | None, grid: torch.Tensor):
    """The library's ``name`` pass for the scores' dtype, with its item arguments bound."""
    suffix = "f32" if scores.dtype == torch.float32 else "f64"
    fn = getattr(lib, f"rl_gap_fast_{name}_{suffix}")
    valid_ptr = None if valid is None else valid.data_ptr()
    return functools.partial(fn, scores.data_ptr(), valid_ptr, scores.numel(), grid.data_ptr())


def moments(
    scores: torch.Tensor,
    valid: torch.Tensor | None,
    grid: torch.Tensor,
    order: int,
    rows: int,
) -> torch.Tensor:
    """Per-row ``sum t^k``, k = 0..order, of the binned scores: (rows, order + 1) float64.

    Args:
        scores: (M,) contiguous CPU float32/float64 (the binning dtype).
        valid: optional (M,) contiguous bool; invalid items go to row 0.
        grid: ``grid_constants(...)`` of the plan.
        order: highest moment (N_f).
        rows: G_f + 2.
    """
    lib = native_library()
    width = 4 if order < 4 else 8  # whole 32/64-byte rows: one cache line per item
    threads = max(1, torch.get_num_threads())
    copies = SMALL_TABLE_COPIES if rows * width * 8 < SMALL_TABLE_BYTES else 1
    tables = torch.zeros(threads * copies, rows, width, dtype=torch.float64)
    _pass(lib, "moments", scores, valid, grid)(
        order, rows, width, copies, tables.data_ptr(), threads
    )
    total = tables[0] if tables.shape[0] == 1 else tables.sum(0)
    return total[:, : order + 1]


def evaluate(
    scores: torch.Tensor,
    valid: torch.Tensor | None,
    grid: torch.Tensor,
    table: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """``out[j] = sum_l table[row_j, l] t_j^l`` in the binning dtype (Horner), in place.

    Args:
        scores: (M,) contiguous CPU float32/float64 (the binning dtype).
        valid: optional (M,) contiguous bool.
        grid: ``grid_constants(...)`` of the plan.
        table: (rows, order + 1) float64 coefficients.
        out: (M,) contiguous tensor of the scores' dtype.
    """
    lib = native_library()
    order = table.shape[1] - 1
    width = 4 if order < 4 else 8
    packed = table.new_zeros(table.shape[0], width, dtype=scores.dtype)
    packed[:, : order + 1] = table
    _pass(lib, "evaluate", scores, valid, grid)(
        order, width, packed.data_ptr(), out.data_ptr(), max(1, torch.get_num_threads())
    )


def drop_mask(
    scores: torch.Tensor, positive: torch.Tensor, valid: torch.Tensor | None, rate: float
) -> torch.Tensor | None:
    """Keep mask without the ``floor(rate · N)`` lowest negatives, or None if unusable.

    Args:
        scores: (M,) contiguous CPU float32/float64 scores (finite).
        positive: (M,) contiguous bool; valid: optional (M,) contiguous bool.
        rate: α in [0, 1).

    Returns:
        (M,) bool keep mask (``valid`` itself, or all True, when nothing is dropped).
    """
    if not drop_passes_usable(scores, positive, valid):
        return None
    lib = native_library()
    keep = torch.empty_like(positive)
    suffix = "f32" if scores.dtype == torch.float32 else "f64"
    dropped = getattr(lib, f"rl_gap_fast_drop_{suffix}")(
        scores.data_ptr(),
        positive.data_ptr(),
        None if valid is None else valid.data_ptr(),
        scores.numel(),
        float(rate),
        keep.data_ptr(),
        _drop_threads(),
    )
    if dropped == 0:
        return torch.ones_like(positive) if valid is None else valid
    return keep


# The drop select's digit width: histograms of 2^16 bins, float32 keys in 2 passes.
DROP_DIGIT_BITS = 16


def drop_passes_usable(scores: torch.Tensor, positive: torch.Tensor, valid) -> bool:
    """Whether ``drop_histogram`` / ``drop_mark`` apply (contiguous CPU float32/float64)."""
    return (
        scores.device.type == "cpu"
        and scores.dtype in (torch.float32, torch.float64)
        and scores.is_contiguous()
        and positive.is_contiguous()
        and (valid is None or valid.is_contiguous())
        and native_library() is not None
    )


def _drop_pass(name: str, scores: torch.Tensor, positive: torch.Tensor, valid):
    lib = native_library()
    suffix = "f32" if scores.dtype == torch.float32 else "f64"
    return functools.partial(
        getattr(lib, f"rl_gap_fast_drop_{name}_{suffix}"),
        scores.data_ptr(),
        positive.data_ptr(),
        None if valid is None else valid.data_ptr(),
        scores.numel(),
    )


def _drop_threads() -> int:
    # Memory-bound passes; each thread zeroes and merges a 512 KB histogram per pass.
    return max(1, min(torch.get_num_threads(), DROP_MAX_THREADS))


def drop_histogram(
    scores: torch.Tensor, positive: torch.Tensor, valid, shift: int, prefix: int
) -> torch.Tensor:
    """(2^16,) int64 histogram of digit ``[shift, shift + 16)`` of the negatives' order keys.

    Keys are the library's unsigned order-preserving keys (−0.0 folded onto +0.0).
    Only negatives (``~positive``, and ``valid`` where given) whose digits above
    ``shift`` equal ``prefix`` are counted; on the top digit every negative is.
    """
    counts = torch.empty(1 << DROP_DIGIT_BITS, dtype=torch.int64)
    _drop_pass("histogram", scores, positive, valid)(
        int(shift), int(prefix), counts.data_ptr(), _drop_threads()
    )
    return counts


def drop_mark(
    scores: torch.Tensor, positive: torch.Tensor, valid, cut_key: int, ties_to_drop: int
) -> tuple[torch.Tensor, int]:
    """Keep mask ``valid & (positive | key >= cut_key)`` without the first ``ties_to_drop``
    negatives keyed exactly ``cut_key`` (flat order); also returns how many negatives tie."""
    keep = torch.empty_like(positive)
    tied = _drop_pass("mark", scores, positive, valid)(
        int(cut_key), int(ties_to_drop), keep.data_ptr(), _drop_threads()
    )
    return keep, int(tied)
