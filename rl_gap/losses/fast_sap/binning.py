"""The O(M) passes of the fast smoothed-AP kernel: fine-grid binning, moments, per-item polynomials.

Every pass runs over chunks of ``chunk_elements(device)`` items into buffers
allocated once per call (a fresh ≥16 MB tensor costs milliseconds of page
faults), and does a handful of elementwise ops per item, no sort:

    cell = clamp(floor(s/h_f − lo/h_f), −1, G_f)     (−1 / G_f: below / above the window)
    t    = (s − centre(cell)) / h_f                   (exact: h_f a power of two)

Moments ``sum t^k`` are scatter-added in float64 two at a time (a complex128
``scatter_add_`` adds a (t^k, t^(k+1)) pair per item); per-item polynomials are
read back four float32 coefficients at a time (one complex128 ``take``).

Only the items that can contribute are binned: a first elementwise pass marks
them (valid, kept by negative dropping, not below the window; for the
polynomials, in a cell whose table row is not 0) and one ``nonzero`` per call
compacts their indices (8 bytes per kept item). Below-window, dropped and
invalid items are typically 86-99.7% of a batch (τ = 0.01 .. 1e-3, α = 0 .. 0.95),
and sending them all to one sink row would serialise that many float64 atomics
on a GPU.

On CPU, ``native`` does each of the two passes in one fused loop
(``USE_NATIVE``); the torch code here is the reference and the CUDA path.
"""

from __future__ import annotations

import torch

from rl_gap.losses.fast_sap import native as fast_native
from rl_gap.losses.fast_sap.grid import GridPlan

# Items per chunk: an L2-sized working set on CPU; on an accelerator a chunk is a few kernel
# launches, so larger chunks (~60 bytes of buffers per item: 250 MB at 2^22) amortise them.
CHUNK_ELEMENTS = 1 << 18
DEVICE_CHUNK_ELEMENTS = 1 << 22
# Use the optional one-pass CPU library (``native``) when it applies.
USE_NATIVE = True
# Devices whose scatter_add_ handles complex128 (two float64 moments per add).
PAIRED_SCATTER_DEVICES = ("cpu",)


def chunk_elements(device: torch.device) -> int:
    """Items per chunk of the torch passes on ``device``."""
    return CHUNK_ELEMENTS if device.type == "cpu" else DEVICE_CHUNK_ELEMENTS


class _Binner:
    """Chunk buffers and the cell/offset computation for one plan."""

    def __init__(self, plan: GridPlan, device: torch.device, chunk: int) -> None:
        self.plan = plan
        dtype = plan.bin_dtype
        self.cell = torch.empty(chunk, dtype=dtype, device=device)
        self.offset = torch.empty(chunk, dtype=dtype, device=device)
        self.row = torch.empty(chunk, dtype=torch.int64, device=device)
        self.cast = torch.empty(chunk, dtype=dtype, device=device)
        self.invalid = torch.empty(chunk, dtype=torch.bool, device=device)
        self.gathered = torch.empty(0, device=device)
        self.inv_h = 1.0 / plan.h_fine
        self.lo_cells = plan.lo / plan.h_fine  # an integer: lo is a multiple of h_c
        self.first_centre = plan.lo + 0.5 * plan.h_fine

    def _cells(self, scores: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        n = scores.numel()
        cell = self.cell[:n]
        if scores.dtype != cell.dtype:
            scores = self.cast[:n].copy_(scores)
        torch.mul(scores, self.inv_h, out=cell)
        cell.sub_(self.lo_cells).floor_().clamp_(-1.0, float(self.plan.num_fine))
        if valid is not None:
            cell.masked_fill_(torch.logical_not(valid, out=self.invalid[:n]), -1.0)
        return cell

    def kept_index(
        self,
        scores: torch.Tensor,
        valid: torch.Tensor | None,
        keep_row: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Ascending (K,) int64 indices of the items outside the sink row 0.

        With ``keep_row`` ((G_f + 2,) bool), of the items whose row is marked instead.
        The one host synchronisation of a pass (the size of the ``nonzero``).
        """
        chunk = self.cell.numel()
        mask = torch.empty(scores.numel(), dtype=torch.bool, device=scores.device)
        for start in range(0, scores.numel(), chunk):
            part = None if valid is None else valid[start : start + chunk]
            cell = self._cells(scores[start : start + chunk], part)
            row = self.row[: cell.numel()]
            row.copy_(cell).add_(1)
            out = mask[start : start + cell.numel()]
            if keep_row is None:
                torch.ne(row, 0, out=out)
            else:
                torch.index_select(keep_row, 0, row, out=out)
        return mask.nonzero().squeeze(1)

    def gather(self, scores: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """``scores[index]`` into a chunk buffer (``index`` no longer than a chunk)."""
        if self.gathered.dtype != scores.dtype or self.gathered.numel() < self.cell.numel():
            self.gathered = torch.empty(self.cell.numel(), dtype=scores.dtype, device=scores.device)
        return torch.index_select(scores, 0, index, out=self.gathered[: index.numel()])

    def __call__(
        self, scores: torch.Tensor, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Row in the fine tables (0: below the window or invalid, G_f + 1: above) and offset t.

        Returns views into the buffers, valid until the next call.
        """
        n = scores.numel()
        offset, row = self.offset[:n], self.row[:n]
        if scores.dtype != self.cell.dtype:
            scores = self.cast[:n].copy_(scores)
        cell = self._cells(scores, valid)
        row.copy_(cell).add_(1)
        # centre = cell·h_f + (lo + h_f/2): exact, so t is exact (Sterbenz).
        torch.mul(cell, self.plan.h_fine, out=offset).add_(self.first_centre)
        torch.sub(scores, offset, out=offset).mul_(self.inv_h).clamp_(-1.0, 1.0)
        return row, offset


def native_applicable(scores: torch.Tensor, valid: torch.Tensor | None) -> bool:
    """Whether the one-pass native library will run the O(M) passes for these scores
    (given a plan whose binning dtype is the scores' dtype, the usual case)."""
    return USE_NATIVE and fast_native.usable(scores, scores.dtype, valid)


def _native_grid(plan: GridPlan) -> torch.Tensor:
    """The binning constants of ``_Binner`` for the native library."""
    return fast_native.grid_constants(
        1.0 / plan.h_fine,
        plan.lo / plan.h_fine,
        plan.h_fine,
        plan.lo + 0.5 * plan.h_fine,
        plan.num_fine,
    )


def fine_moments(
    scores: torch.Tensor, plan: GridPlan, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """Per fine cell, ``sum_j t_j^k`` for k = 0..N_f over the (valid) items, accumulated in float64.

    Returns:
        (G_f + 2, N_f + 1) float64; the last row holds the items above the window
        (only its count is used); row 0, the sink of the items below the window and
        of invalid ones, is left 0 (nothing reads it; the native pass skips it).
    """
    if USE_NATIVE and fast_native.usable(scores, plan.bin_dtype, valid):
        return fast_native.moments(
            scores, valid, _native_grid(plan), plan.fine_order, plan.num_fine + 2
        )
    device = scores.device
    chunk = min(chunk_elements(device), max(scores.numel(), 1))
    binner = _Binner(plan, device, chunk)
    pairs = (plan.fine_order + 2) // 2
    rows = plan.num_fine + 2
    tables = [torch.zeros(rows, dtype=torch.complex128, device=device) for _ in range(pairs)]
    powers = torch.empty(pairs, chunk, 2, dtype=torch.float64, device=device)
    powers[0, :, 0] = 1.0
    paired = device.type in PAIRED_SCATTER_DEVICES
    # Only items outside the sink row (valid, not below the window) are binned.
    kept = binner.kept_index(scores, valid)
    for start in range(0, kept.numel(), chunk):
        row, t = binner(binner.gather(scores, kept[start : start + chunk]))
        n = row.numel()
        power = powers[:, :n]
        power[0, :, 1].copy_(t)
        t64 = power[0, :, 1]
        for k in range(2, 2 * pairs):
            torch.mul(power[(k - 1) // 2, :, (k - 1) % 2], t64, out=power[k // 2, :, k % 2])
        for table, values in zip(tables, power):
            if paired:
                table.scatter_add_(0, row, torch.view_as_complex(values))
            else:  # complex atomics are not available on every accelerator
                real = torch.view_as_real(table)
                real[:, 0].index_add_(0, row, values[:, 0].contiguous())
                real[:, 1].index_add_(0, row, values[:, 1].contiguous())
    moments = torch.stack([torch.view_as_real(table) for table in tables], 1).reshape(rows, -1)
    return moments[:, : plan.fine_order + 1]


def evaluate_fine(
    scores: torch.Tensor,
    plan: GridPlan,
    table: torch.Tensor,
    out: torch.Tensor,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[j] = sum_l table[row_j, l] t_j^l`` for every item (Horner), chunked.

    Args:
        scores: (M,) scores.
        plan: the grid.
        table: (G_f + 2, N_f + 1) float64 per-fine-cell polynomial coefficients.
        out: (M,) tensor written in place (any float dtype).
        valid: optional (M,) bool; invalid items read the sink row (0 if the table's is).

    Items whose row of ``table`` is all zero (the sink rows of ``taylor_to_fine``'s tables,
    invalid items) get 0 without being evaluated.
    """
    dtype, order = plan.bin_dtype, plan.fine_order
    if (
        USE_NATIVE
        and out.dtype == dtype
        and out.is_contiguous()
        and fast_native.usable(scores, dtype, valid)
    ):
        fast_native.evaluate(scores, valid, _native_grid(plan), table, out)
        return out
    # Pad the coefficient rows to whole complex128 words, so one gather reads a row.
    width = order + 1
    per_word = 16 // torch.empty((), dtype=dtype).element_size()
    words = -(-width // per_word)
    packed = table.new_zeros(table.shape[0], words * per_word).to(dtype)
    packed[:, :width] = table
    packed = packed.view(torch.complex128)  # (G_f + 2, words)
    chunk = min(chunk_elements(scores.device), max(scores.numel(), 1))
    binner = _Binner(plan, scores.device, chunk)
    gathered = torch.empty(chunk, words, dtype=torch.complex128, device=scores.device)
    acc = torch.empty(chunk, dtype=dtype, device=scores.device)
    flat = packed.reshape(-1) if words == 1 else None
    # A row of zero coefficients evaluates to 0: only items in other rows are evaluated.
    keep_row = table.ne(0).any(1)
    kept = binner.kept_index(scores, valid, keep_row)
    out.zero_()
    for start in range(0, kept.numel(), chunk):
        index = kept[start : start + chunk]
        part = None if valid is None else valid.index_select(0, index)  # read row 0 if not
        row, t = binner(binner.gather(scores, index), part)
        n = row.numel()
        if flat is not None:
            torch.take(flat, row, out=gathered[:n, 0])
        else:
            torch.index_select(packed, 0, row, out=gathered[:n])
        coef = gathered[:n].view(dtype)  # (n, words * per_word)
        result = acc[:n]
        torch.addcmul(coef[:, order - 1], coef[:, order], t, out=result)
        for k in range(order - 2, -1, -1):
            torch.addcmul(coef[:, k], result, t, out=result)
        out.index_copy_(0, index, result.to(out.dtype))
    return out
