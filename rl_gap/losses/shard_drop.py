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
flipped, −0.0 folded onto +0.0 as the comparison sort does), and the key is
selected digit by digit (11 bits per pass, most significant first): each
pass histograms the local candidates' current digit, the 2048-bin
histograms are all-reduced, and every rank keeps the candidates in the bin
holding the k-th item. float32 keys take 3 passes, float64 keys 6.
Communication: 16 KiB per pass, plus one all-gather of each rank's tie count
to resolve r in flat order.
"""

from __future__ import annotations

import torch

from rl_gap.losses import shard_comm
from rl_gap.losses.common import num_dropped

DIGIT_BITS = 11


def order_keys(scores: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Order-preserving int64 keys of float32/float64 scores and their bit width.

    ``a < b`` (as floats, −0.0 == +0.0) iff ``key(a) < key(b)`` as unsigned
    integers of the returned width, stored in int64.
    """
    work = scores.detach()
    if work.dtype not in (torch.float32, torch.float64):
        work = work.float()  # half -> float32 is exact and order-preserving
    work = work + 0.0  # −0.0 + 0.0 = +0.0: one key for both zeros
    if work.dtype == torch.float32:
        bits = work.view(torch.int32).to(torch.int64)
        width = 32
    else:
        bits = work.view(torch.int64)
        width = 64
    magnitude = (1 << (width - 1)) - 1
    # Negative floats: flip the magnitude bits so that larger magnitude sorts lower;
    # then flip the sign bit so the order is that of unsigned integers.
    flipped = torch.where(bits < 0, bits ^ magnitude, bits)
    if width == 32:
        keys = (flipped + (1 << 31)) & 0xFFFFFFFF
    else:
        keys = flipped ^ torch.iinfo(torch.int64).min
    return keys, width


def _digit(keys: torch.Tensor, shift: int, bits: int) -> torch.Tensor:
    return (keys >> shift) & ((1 << bits) - 1)


def select_kth(keys: torch.Tensor, k: int, width: int) -> tuple[torch.Tensor, int]:
    """The global k-th smallest key (1-based) and its rank among the global ties at it.

    Args:
        keys: (n_local,) int64 keys of this rank's candidates.
        k: 1 <= k <= global number of keys.
        width: key width in bits (32 or 64).

    Returns:
        (the key as a 0-d int64 tensor, r = k − #{keys < it} in [1, #{keys = it}]).
    """
    candidates = keys
    prefix = torch.zeros((), dtype=torch.int64, device=keys.device)
    remaining = k
    shift = width
    while shift > 0:
        bits = min(DIGIT_BITS, shift)
        shift -= bits
        digit = _digit(candidates, shift, bits)
        hist = torch.bincount(digit, minlength=1 << bits).to(torch.int64)
        shard_comm.all_reduce(hist)
        cum = hist.cumsum(0)
        chosen = int(torch.searchsorted(cum, torch.tensor(remaining, device=cum.device)))
        if chosen:
            remaining -= int(cum[chosen - 1])
        prefix = prefix | (torch.tensor(chosen, dtype=torch.int64, device=keys.device) << shift)
        candidates = candidates[digit == chosen]
    return prefix, remaining


@torch.no_grad()
def sharded_drop_mask(
    scores: torch.Tensor, positive: torch.Tensor, valid: torch.Tensor | None, rate: float
) -> torch.Tensor:
    """This rank's keep mask after dropping the global list's ``floor(rate · N)`` lowest negatives.

    Same set, restricted to this rank, as ``drop_lowest_negatives`` applied to
    the concatenation over ranks of ``scores[valid]`` (one process, one list).
    Every rank must call it (collectives inside).

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
    negative = base & ~positive
    local_neg = int(torch.count_nonzero(negative))
    k = int(num_dropped(shard_comm.global_count(local_neg, scores.device), rate))
    if k == 0:
        return base
    keys, width = order_keys(scores.reshape(-1))
    cut, ties_to_drop = select_kth(keys[negative], k, width)
    if width == 64:  # compare as signed int64: undo the sign-bit flip on both sides
        keys, cut = keys ^ torch.iinfo(torch.int64).min, cut ^ torch.iinfo(torch.int64).min
    below = negative & (keys < cut)
    tied = (negative & (keys == cut)).nonzero().squeeze(1)  # ascending local flat positions
    counts = shard_comm.all_gather_sizes(tied.numel(), scores.device)
    rank, _ = shard_comm.require_group()
    before = sum(counts[:rank])  # ties at v held by earlier ranks: earlier in flat order
    mine = min(max(ties_to_drop - before, 0), tied.numel())
    keep = base & ~below
    keep[tied[:mine]] = False
    return keep
