"""Two-level uniform grid for the fast smoothed-AP kernel: planning and the coarse-grid maths.

Scores are binned (no sort) into a *fine* grid of step h_f = h_c / 2^r inside
a *coarse* grid of step h_c (both powers of two, the window's lower edge a
multiple of h_c, so every cell centre is an exactly representable float and
the offsets s − centre are exact, in float32 too).

- Sources (all M items) -> fine moments ``sum_j t_j^k``, k <= N_f (t_j the
  offset from the fine centre in fine units) in O(M) elementwise passes and
  scatter-adds (``binning``) -> shifted exactly to coarse moments of
  order N (one small matmul, "moment to moment").
- Coarse grid: with source offset T' and query offset T (coarse units), and
  r = h_c/τ, every kernel is expanded jointly,
  σ^(b)((k + T' − T) r) = sum_{n+l <= N} σ^(b+n+l)(k r) (T' r)^n/n! (−T r)^l/l!,
  so ``H_{b,l}[C] = sum_k sum_n m̃_n[C + k] σ^(b+n+l)(k r)`` is a correlation
  of the moment rows with fixed kernels over the band |k| <= K, done by FFT
  (O(G log G)). Cells farther above a query contribute exactly their count
  (σ = 1 to the tolerance, a suffix sum), farther below nothing.
- Queries: the P positives read their cell's polynomial in T; every item
  reads its *fine* cell's short polynomial (coarse Taylor coefficients
  re-expanded about fine centres, "local to local").

Error bound (relative, per kernel sum; see ``taylor``):
``fine_bound(t_f, N_f) + coarse_bound(r, N) + 4·M·e^(−U)`` with
t_f = h_f/(2τ) (plus binning rounding) and |T' − T| r <= r <= 1/2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache, lru_cache

import torch

from rl_gap.losses.fast_sap.taylor import coarse_bound, fine_bound, sigmoid_derivatives

FINE_ORDERS = (3, 4, 5, 6, 7)
# Fine tables up to this size count as cache-resident when choosing the fine order.
CACHE_TABLE_BYTES = 1 << 18
COARSE_ORDERS = (8, 10, 12, 14, 16)
MAX_FINE_CELLS = 1 << 23


def _quantize_up(x: float) -> float:
    """Round up to the grid 2^(k/8), so that cached bounds are reused (conservative)."""
    return 2.0 ** (math.ceil(8.0 * math.log2(x)) / 8.0)


@cache
def _fine_bound_q(offset_q: float, order: int) -> float:
    return fine_bound(offset_q, order)


@cache
def _coarse_bound_q(offset_q: float, order: int, fine_offset_q: float, fine_order: int) -> float:
    return coarse_bound(offset_q, order, fine_offset_q, fine_order)


class PlanError(ValueError):
    """No grid within ``MAX_FINE_CELLS`` cells / the Taylor orders reaches the tolerance.

    Raised before any work is done (tiny τ against a wide score window, or scores
    scaled far beyond cosine range); ``impl="auto"`` callers fall back to the exact sweep.
    """


@dataclass(frozen=True)
class GridPlan:
    """Grid geometry and expansion orders for one call.

    Attributes:
        lo: lower edge of the grid window (a multiple of ``h_coarse``).
        h_coarse, h_fine: cell steps (powers of two), h_fine = h_coarse / 2^refine.
        refine: log2 of fine cells per coarse cell.
        num_coarse, num_fine: cell counts of the window (num_fine = num_coarse · 2^refine).
        fine_order: N_f, Taylor order of the per-item (fine) expansions.
        coarse_order: N, joint Taylor order of the coarse expansion.
        band: K, half-width of the band in coarse cells (beyond: saturated).
        temperature: τ.
        bound: guaranteed relative error of every kernel sum.
        bin_dtype: dtype of the O(M) binning passes (float32 when exact, else float64).
    """

    lo: float
    h_coarse: float
    h_fine: float
    refine: int
    num_coarse: int
    num_fine: int
    fine_order: int
    coarse_order: int
    band: int
    temperature: float
    bound: float
    bin_dtype: torch.dtype

    @property
    def ratio(self) -> float:
        """h_c / τ."""
        return self.h_coarse / self.temperature


def plan_grid(
    lo_all: float,
    hi_all: float,
    lo_pos: float,
    hi_pos: float,
    num_items: int,
    temperature: float,
    tolerance: float,
    score_dtype: torch.dtype,
    cache_tables: bool = True,
) -> GridPlan:
    """Choose the grid and orders so that every kernel sum has relative error <= tolerance/2.

    Budget: fine expansion tolerance/4, coarse expansion tolerance/16, band
    truncation tolerance/16 (the rest is slack for float64 rounding). Since
    |Δ(R_P/R_A)| <= 2·(relative error of the sums), |ΔSAP| <= tolerance.

    Args:
        lo_all, hi_all: score range of all items; lo_pos, hi_pos: of the positives.
        num_items: M.
        temperature: τ.
        tolerance: bound on the absolute error of SAP.
        score_dtype: dtype of the scores (float64 scores are binned in float64).
        cache_tables: pick the fine order for cache-resident tables (the native
            passes); False: the lowest order that fits (the torch passes, whose
            cost grows with the number of moments scattered).
    """
    tau = temperature
    h_coarse = 2.0 ** math.floor(math.log2(tau / 2.0))
    ratio = h_coarse / tau  # in (1/4, 1/2]
    truncation = tolerance / 16.0
    reach = math.log(4.0 * max(num_items, 1) / truncation)  # U, in units of τ
    band = math.ceil(reach / ratio) + 2
    window_lo = max(lo_all, lo_pos - reach * tau)
    window_hi = min(hi_all, hi_pos + reach * tau)
    lo = math.floor(window_lo / h_coarse) * h_coarse
    num_coarse = int(math.floor((window_hi - lo) / h_coarse)) + 1
    candidates = []  # (table bytes, order, refine, num_fine, fine offset)
    for fine_order in FINE_ORDERS:
        for refine in range(0, 16):
            num_fine = num_coarse << refine
            # The binned offset may exceed 1/2 cell by the rounding of (s − lo)/h_f.
            slack = num_fine * 2.0**-22
            fine_offset = _quantize_up((0.5 + slack) * ratio / 2**refine)
            if _fine_bound_q(fine_offset, fine_order) <= tolerance / 4.0:
                break
        else:
            continue
        if num_fine <= MAX_FINE_CELLS:
            row_bytes = 32 if fine_order < 4 else 64  # the native tables' row width
            candidates.append(
                ((num_fine + 2) * row_bytes, fine_order, refine, num_fine, fine_offset)
            )
    if not candidates:
        raise PlanError(
            f"fast smoothed AP cannot reach tolerance {tolerance:g} at temperature {tau:g} over a "
            f"score window of width {window_hi - window_lo:g} within {MAX_FINE_CELLS} grid cells; "
            "use the exact implementation or a larger tolerance"
        )
    # Every item does one read-modify-write (forward) and one read (backward) of
    # its fine row at a random place: the lowest order whose table stays
    # cache-resident is cheapest, else the smallest table (measured, 2-core Zen1).
    small = [c for c in candidates if c[0] <= CACHE_TABLE_BYTES or not cache_tables]
    _, fine_order, refine, num_fine, fine_offset = small[0] if small else min(candidates)
    # Joint offset |T' − T| <= 1 coarse cell (+ the binning slack).
    coarse_offset = _quantize_up(ratio * (1.0 + num_coarse * 2.0**-21 + 2.0**-10))
    for coarse_order in COARSE_ORDERS:
        err = _coarse_bound_q(coarse_offset, coarse_order, fine_offset, fine_order)
        if err <= tolerance / 16.0:
            break
    else:
        raise PlanError(
            f"fast smoothed AP cannot reach tolerance {tolerance:g} with Taylor orders up to "
            f"{COARSE_ORDERS[-1]}; use the exact implementation or a larger tolerance"
        )
    h_fine = h_coarse / 2**refine
    # float32 binning is exact when every fine-cell centre is a float32 (|centre| < 2^23 h_f).
    extent = max(abs(lo), abs(lo + num_coarse * h_coarse)) + h_coarse
    exact_f32 = extent < 2.0**22 * h_fine and score_dtype != torch.float64
    return GridPlan(
        lo=lo,
        h_coarse=h_coarse,
        h_fine=h_fine,
        refine=refine,
        num_coarse=num_coarse,
        num_fine=num_fine,
        fine_order=fine_order,
        coarse_order=coarse_order,
        band=band,
        temperature=tau,
        bound=_fine_bound_q(fine_offset, fine_order) + err + truncation,
        bin_dtype=torch.float32 if exact_f32 else torch.float64,
    )


def moment_factors(order: int, ratio: float, device: torch.device) -> torch.Tensor:
    """ratio^n / n! for n = 0..order (float64)."""
    return torch.tensor(
        [ratio**n / math.factorial(n) for n in range(order + 1)], dtype=torch.float64, device=device
    )


def fft_size(target: int) -> int:
    """Smallest 5-smooth integer (2^a 3^b 5^c) >= target: a fast FFT length, < 1.25x waste."""
    best = 1 << math.ceil(math.log2(max(target, 1)))
    power5 = 1
    while power5 < best:
        power35 = power5
        while power35 < best:
            size = power35 << max(0, math.ceil(math.log2(target / power35)))
            best = min(best, size)
            power35 *= 3
        power5 *= 5
    return best


@lru_cache(maxsize=32)
def _kernel_spectra(
    ratio: float, band: int, orders: int, n_fft: int, device: torch.device
) -> torch.Tensor:
    """conj(rfft) of σ^(j)(k r), |k| <= K, j < ``orders``, laid out circularly: (J, F).

    Cached: a training run calls this with the same few plans over and over.
    """
    offsets = torch.arange(-band, band + 1, device=device, dtype=torch.float64)
    kernels = sigmoid_derivatives(offsets * ratio, orders - 1).T  # (J, 2K+1)
    circular = kernels.new_zeros(kernels.shape[0], n_fft)
    circular[:, : band + 1] = kernels[:, band:]
    circular[:, n_fft - band :] = kernels[:, :band]
    return torch.fft.rfft(circular).conj()


def correlate_band(
    moments: torch.Tensor, plan: GridPlan, shifts: tuple[int, ...], order: int | None = None
) -> torch.Tensor:
    """``H[a, b, l, C] = sum_{|k|<=K} sum_{n <= N−l} m̃[a, n, C+k] σ^(shifts[b]+n+l)(k r)`` by FFT.

    In the frequency domain ``Ĥ[a, b, l] = sum_n M̂[a, n] K̂[shifts[b] + l + n]`` (a
    Hankel product): accumulated in place over n into one spectrum buffer, then
    one batched inverse FFT (no per-(b, l) temporaries of the moment spectra's size).

    Args:
        moments: (A, N+1, G) scaled coarse moments m̃_n = m_n r^n / n!.
        plan: the grid (N = coarse_order, K = band, r = ratio).
        shifts: kernel derivative offsets b (0: σ sums, 1: σ' sums).
        order: N if not ``plan.coarse_order``.

    Returns:
        (A, len(shifts), N+1, G) float64.
    """
    order = plan.coarse_order if order is None else order
    band, size = plan.band, moments.shape[-1]
    n_fft = fft_size(size + band + 1)
    kernel_f = _kernel_spectra(
        plan.ratio, band, order + max(shifts) + 1, n_fft, moments.device
    )  # (J, F)
    moment_f = torch.fft.rfft(moments, n_fft)  # (A, N+1, F)
    spectrum = moment_f.new_zeros(moments.shape[0], len(shifts), order + 1, moment_f.shape[-1])
    for b, shift in enumerate(shifts):
        for n in range(order + 1):
            # l = 0..N−n reads kernels shift + n + l.
            window = kernel_f[shift + n : shift + order + 1].unsqueeze(0)  # (1, N+1−n, F)
            spectrum[:, b, : order + 1 - n].addcmul_(moment_f[:, n : n + 1], window)
    return torch.fft.irfft(spectrum, n_fft)[..., :size]


def query_powers(offset: torch.Tensor, plan: GridPlan, order: int | None = None) -> torch.Tensor:
    """(−T r)^l / l! for l = 0..N at the query offsets T: (N+1, Q) float64 (N: plan's or ``order``)."""
    order = plan.coarse_order if order is None else order
    factors = moment_factors(order, -plan.ratio, offset.device)
    return _powers(offset, order) * factors.unsqueeze(1)


def _powers(x: torch.Tensor, order: int) -> torch.Tensor:
    """x^n for n = 0..order by repeated products: (order + 1, len(x)) (``pow`` is ~10x slower)."""
    out = x.new_empty(order + 1, x.numel())
    out[0] = 1.0
    if order >= 1:
        torch.cumprod(x.unsqueeze(0).expand(order, -1), 0, out=out[1:])
    return out


def coarse_position(scores: torch.Tensor, plan: GridPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Coarse cell index and offset T (coarse units, float64) of in-window scores (the positives)."""
    x = (scores.to(torch.float64) - plan.lo) / plan.h_coarse
    cell = x.floor().clamp_(0, plan.num_coarse - 1)
    return cell.long(), x - cell - 0.5


def point_moments(
    cell: torch.Tensor,
    offset: torch.Tensor,
    weights: torch.Tensor,
    plan: GridPlan,
    order: int | None = None,
) -> torch.Tensor:
    """Coarse moments ``sum_i w_i T_i^n`` of weighted points, (q, N+1, G) for weights (P, q)."""
    order = plan.coarse_order if order is None else order
    powers = _powers(offset, order).T  # (P, N+1)
    values = weights.unsqueeze(2) * powers.unsqueeze(1)  # (P, q, N+1)
    table = values.new_zeros(plan.num_coarse, weights.shape[1] * (order + 1))
    table.index_add_(0, cell, values.reshape(cell.numel(), -1))
    return table.reshape(plan.num_coarse, weights.shape[1], order + 1).permute(1, 2, 0)


def _fine_offsets(refine: int, device: torch.device) -> torch.Tensor:
    """Offsets of the fine-cell centres from their coarse centre, in coarse units."""
    per = 2**refine
    return (torch.arange(per, dtype=torch.float64, device=device) + 0.5) / per - 0.5


@lru_cache(maxsize=32)
def _binomial_shift(refine: int, fine_order: int, order: int, device: torch.device) -> torch.Tensor:
    """S[f, k, n] = C(n, k) o_f^(n−k) 2^(−rk): (o_f + t/2^r)^n = sum_k S[f, k, n] t^k, k <= N_f."""
    offsets = _fine_offsets(refine, device)
    shift = torch.zeros(2**refine, fine_order + 1, order + 1, dtype=torch.float64, device=device)
    for n in range(order + 1):
        for k in range(min(n, fine_order) + 1):
            shift[:, k, n] = math.comb(n, k) * offsets ** (n - k) * 2.0 ** (-refine * k)
    return shift


def coarse_moments(fine: torch.Tensor, plan: GridPlan, order: int | None = None) -> torch.Tensor:
    """Translate fine moments to coarse-cell moments ``sum_j T_j^n``, n <= N_c (T in coarse units).

    T_j = o_f + t_j / 2^r, so T^n = sum_k C(n, k) o_f^(n−k) 2^(−rk) t^k; terms with
    k > N_f are unknown and dropped (that is the fine expansion's error).

    Args:
        fine: (G_f + 2, N_f + 1) fine moments (sink rows first and last).
        plan: the grid; order: N_c if not ``plan.coarse_order``.

    Returns:
        (num_coarse, N_c + 1) float64.
    """
    per, nf = 2**plan.refine, plan.fine_order
    order = plan.coarse_order if order is None else order
    shift = _binomial_shift(plan.refine, nf, order, fine.device)
    inner = fine[1:-1].reshape(plan.num_coarse, per * (nf + 1))
    return inner @ shift.reshape(per * (nf + 1), order + 1)


def taylor_to_fine(coarse_coef: torch.Tensor, plan: GridPlan) -> torch.Tensor:
    """Re-expand per-coarse-cell Taylor coefficients about the fine centres, truncated to N_f.

    Args:
        coarse_coef: (num_coarse, N_c + 1), f(x_C + T h_c) = sum_l c_l T^l.

    Returns:
        (num_fine + 2, N_f + 1) with f(x_f + t h_f) ≈ sum_l' d_l' t^l'; sink rows 0.
    """
    per, nf, nc = 2**plan.refine, plan.fine_order, plan.coarse_order
    # Same binomial re-expansion as the moments, read the other way round.
    shift = _binomial_shift(plan.refine, nf, nc, coarse_coef.device)  # (per, N_f+1, N_c+1)
    out = coarse_coef.new_zeros(plan.num_fine + 2, nf + 1)
    inner = out[1:-1].view(plan.num_coarse, per * (nf + 1))
    torch.matmul(coarse_coef, shift.reshape(per * (nf + 1), nc + 1).T, out=inner)
    return out
