"""Negative dropping over a list sharded across ranks: a distributed radix select.

The global list is the concatenation, in rank order, of every rank's flat
items (rank r holds rows of the global matrix after those of ranks < r, so
rank order then local row-major order *is* the global flat order). Negative
dropping (gSAP paper §3.4; ``rl_gap.losses.common.drop_lowest_negatives``)
drops the ``k = floor(α · N)`` lowest negatives, ties broken by flat position
(lower first). That set is a lexicographic threshold (``fast_drop``): with v
the k-th smallest negative score and r = k − #{negatives < v}, a negative is
dropped iff it scores < v, or = v and is among the first r negatives scoring
exactly v in global flat order.

v is found without moving scores between ranks: scores map to
order-preserving integer keys (the float's bits, negatives' magnitude bits
flipped, −0.0 folded onto +0.0 as the comparison sort does; int32 for
float32 scores), and the key is selected digit by digit (11 bits per pass,
most significant first): each pass histograms the local candidates' current
digit, the 2048-bin histograms are all-reduced, and every rank keeps the
candidates in the bin holding the k-th item (the first pass keys the local
list in chunks, so no full-size key array exists). float32 keys take 3
passes, float64 keys 6.
Communication: 16 KiB per pass, plus, when the ties at v are not all dropped,
one all-gather of each rank's tie count to resolve r in flat order.

On CPU float32/float64 scores the passes run in the fast-gSAP library
(``fast_sap.native``: the single-process select's own histogram and marking
passes, 16-bit digits, two passes for float32): each pass is one native scan of
the local list, and its 2^16-bin histogram is all-reduced. The first one in
int64 (512 KiB): its sum is the global number of negatives, so no separate count
is needed; later ones in int32 while that number fits (256 KiB).
"""

from __future__ import annotations

import torch

from rl_gap import dist as shard_comm
from rl_gap.losses.common import num_dropped
from rl_gap.losses.fast_sap import binning as fast_binning
from rl_gap.losses.fast_sap import native as fast_native

DIGIT_BITS = 11
CHUNK_ELEMENTS = 1 << 20  # items keyed at a time in the first pass (bounded temporaries)


def _key_dtype(dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype, int]:
    """(float dtype the keys are taken in, integer key dtype, key width in bits)."""
    if dtype == torch.float64:
        return torch.float64, torch.int64, 64
    return torch.float32, torch.int32, 32  # half -> float32 is exact and order-preserving


def signed_keys(scores: torch.Tensor) -> torch.Tensor:
    """Integer keys with ``a < b`` (floats, −0.0 == +0.0) iff ``key(a) < key(b)`` (signed).

    The float's bits with the magnitude bits of negative floats flipped (a larger
    magnitude sorts lower); −0.0 is folded onto +0.0 first, as the sort treats them.
    """
    float_dtype, int_dtype, width = _key_dtype(scores.dtype)
    bits = (scores.detach().to(float_dtype) + 0.0).view(int_dtype)
    return bits ^ ((bits >> (width - 1)) & ((1 << (width - 1)) - 1))


def _key_to_score(unsigned: int, dtype: torch.dtype) -> float:
    """The float whose key, read as unsigned (sign bit flipped), is ``unsigned``."""
    float_dtype, int_dtype, width = _key_dtype(dtype)
    key = torch.tensor([unsigned - (1 << (width - 1))], dtype=int_dtype)  # signed again
    bits = key ^ ((key >> (width - 1)) & ((1 << (width - 1)) - 1))  # the map is an involution
    return float(bits.view(float_dtype)[0])


def _digit(keys: torch.Tensor, shift: int, bits: int) -> torch.Tensor:
    """Digit ``[shift, shift + bits)`` of the keys read as unsigned (sign bit flipped)."""
    unsigned = keys ^ torch.iinfo(keys.dtype).min
    return (unsigned >> shift) & ((1 << bits) - 1)


def _pick(hist: torch.Tensor, remaining: int) -> tuple[int, int]:
    """The digit holding the ``remaining``-th key of a (global) histogram, and its rank there."""
    cum = hist.cumsum(0)
    chosen = int(torch.searchsorted(cum, torch.tensor(remaining, device=cum.device)))
    return chosen, remaining - (int(cum[chosen - 1]) if chosen else 0)


def _choose(hist: torch.Tensor, remaining: int) -> tuple[int, int]:
    """All-reduce a digit histogram, then ``_pick``."""
    shard_comm.all_reduce(hist)
    return _pick(hist, remaining)


def _first_digit(scores: torch.Tensor, negative: torch.Tensor, k: int):
    """Top digit over every negative, keyed in chunks (no full-size key array).

    Returns the chosen digit, the rank left inside it and this rank's negatives'
    keys in that bin.
    """
    width = _key_dtype(scores.dtype)[2]
    shift, size = width - DIGIT_BITS, 1 << DIGIT_BITS
    hist = torch.zeros(size + 1, dtype=torch.int64, device=scores.device)
    digits = torch.empty(scores.numel(), dtype=torch.int16, device=scores.device)
    for start in range(0, scores.numel(), CHUNK_ELEMENTS):
        part = slice(start, start + CHUNK_ELEMENTS)
        # The top digit of the unsigned key is the arithmetic shift of the signed one + 2^10.
        digit = (signed_keys(scores[part]) >> shift).add_(size // 2)
        digit.masked_fill_(~negative[part], size)  # non-negatives: an extra bin, left out
        hist += torch.bincount(digit, minlength=size + 1)
        digits[part] = digit
    chosen, remaining = _choose(hist[:size].clone(), k)
    candidates = signed_keys(scores[digits == chosen])
    return chosen << shift, remaining, candidates, shift


def select_kth(scores: torch.Tensor, negative: torch.Tensor, k: int) -> tuple[float, int, int]:
    """The global k-th smallest negative score (1-based) and its rank among the ties at it.

    Args:
        scores: (n,) this rank's flat scores; negative: (n,) bool, the candidates.
        k: 1 <= k <= global number of negatives.

    Returns:
        (v, r = k − #{negatives < v}, in [1, #{negatives = v}], #{negatives = v}).
    """
    prefix, remaining, candidates, shift = _first_digit(scores, negative, k)
    while shift > 0:
        bits = min(DIGIT_BITS, shift)
        shift -= bits
        digit = _digit(candidates, shift, bits)
        hist = torch.bincount(digit, minlength=1 << bits).to(torch.int64)
        chosen, remaining = _choose(hist, remaining)
        candidates = candidates[digit == chosen]
        prefix |= chosen << shift
    # The last digit completes the key: its bin counts every rank's negatives at v.
    return _key_to_score(prefix, scores.dtype), remaining, int(hist[chosen])


def _ties_dropped_here(local_ties: int, global_ties: int, remaining: int, device) -> int:
    """How many of this rank's ties at v are dropped: the global first ``remaining`` in flat
    order, of which earlier ranks hold the earliest (their counts are all-gathered only
    when the ties are not all dropped, which distinct scores never need)."""
    if remaining == global_ties:
        return local_ties
    counts = shard_comm.all_gather_sizes(local_ties, device)
    rank, _ = shard_comm.require_group()
    return min(max(remaining - sum(counts[:rank]), 0), local_ties)


@torch.no_grad()
def sharded_drop_mask(
    scores: torch.Tensor, positive: torch.Tensor, valid: torch.Tensor | None, rate: float
) -> torch.Tensor:
    """This rank's keep mask after dropping the global list's ``floor(rate · N)`` lowest negatives.

    Same set, restricted to this rank, as ``drop_lowest_negatives`` applied to
    the concatenation over ranks of ``scores[valid]`` (one process, one list).
    Every rank must call it (collectives inside). Extra memory: a few (n,) bool
    masks, chunk-sized key temporaries and the keys in the selected bin.

    Args:
        scores: (n,) this rank's flat scores (float; gradient not tracked).
        positive: (n,) bool.
        valid: (n,) bool or None; False items stay out.
        rate: α in [0, 1).

    Returns:
        (n,) bool keep mask.
    """
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"neg_drop must be in [0, 1), got {rate}")
    base = torch.ones_like(positive) if valid is None else valid
    if rate == 0.0:
        return base
    work = scores.detach().reshape(-1)
    if fast_binning.USE_NATIVE and fast_native.drop_passes_usable(work, positive, valid):
        return _native_drop_mask(work, positive, valid, rate, base)
    negative = base & ~positive
    local_neg = int(torch.count_nonzero(negative))
    k = int(num_dropped(shard_comm.global_count(local_neg, scores.device), rate))
    if k == 0:
        return base
    cut, remaining, global_ties = select_kth(work, negative, k)
    # Float comparisons give the key order's sets: −0.0 == +0.0 here too.
    keep = base & ~(negative & (work < cut))
    tied = (negative & (work == cut)).nonzero().squeeze(1)  # ascending local flat positions
    keep[tied[: _ties_dropped_here(tied.numel(), global_ties, remaining, scores.device)]] = False
    return keep


def _native_drop_mask(
    scores: torch.Tensor, positive: torch.Tensor, valid, rate: float, base: torch.Tensor
) -> torch.Tensor:
    """``sharded_drop_mask`` with the library's passes (see the module docstring)."""
    width = 64 if scores.dtype == torch.float64 else 32
    bits = fast_native.DROP_DIGIT_BITS
    shift = width - bits
    local = fast_native.drop_histogram(scores, positive, valid, shift, 0)  # every negative
    # int64 on the first pass: its sum is the global number of negatives, which sets k
    # (one collective instead of a count and then the histogram).
    hist = shard_comm.all_reduce(local.clone())
    total = int(hist.sum())
    k = int(num_dropped(total, rate))
    if k == 0:
        return base
    wire = torch.int32 if total < (1 << 31) else torch.int64  # no count exceeds the total
    prefix, remaining = _pick(hist, k)
    while shift > 0:
        shift -= bits
        local = fast_native.drop_histogram(scores, positive, valid, shift, prefix)
        hist = shard_comm.all_reduce(local.to(wire, copy=True))
        chosen, remaining = _pick(hist, remaining)
        prefix = (prefix << bits) | chosen
    # The last digit completes the key: this rank's and every rank's ties at v.
    local_ties = int(local[chosen])
    drop_here = _ties_dropped_here(local_ties, int(hist[chosen]), remaining, scores.device)
    keep, tied = fast_native.drop_mark(scores, positive, valid, prefix, drop_here)
    if tied != local_ties:
        raise RuntimeError(
            f"drop select: {tied} ties at the cut, the histogram counted {local_ties}"
        )
    return keep
