"""Consistency ceiling C, its upper bound and efficiency gAP / C (gSAP paper, App. E).

For fixed per-query rankings, the ceiling is the largest gAP over
order-preserving interleavings of the per-query ranked lists, every list and
the merged list counted as gAP counts them: a tie group is one group, its
negatives ahead of its positives (pessimistic), and every positive of a group
gets the precision at the group's end. A query's list is therefore a chain of
*blocks* — block j holds ``a_j`` negatives (those scoring >= the group, not in
an earlier block) followed by the ``k_j`` tied positives of one tie group; an
optimal interleaving puts each block's negatives right before its positives,
and trailing negatives and distractor queries go last and do not matter.

Lower bound C, the largest gAP of three interleavings:

- the *ratio rule*: pool-adjacent-violators merging of consecutive blocks of a
  chain until densities (positives / items) are non-increasing, then all
  segments by decreasing density (Sidney's ratio rule);
- a *greedy* schedule: repeatedly take the chain head block with the fewest
  negatives;
- the observed interleaving (the scores themselves, gAP), so C >= gAP for every input.

Upper bound U (``ceiling_upper``). In any interleaving, once i positives are
ranked, each query q has contributed some t_q of them (Σ t_q = i) and, ties
pessimistic, at least A_q(t_q) of its negatives, A_q(t) = negatives of q scoring
>= its t-th positive. So the negatives n_i ahead of the i-th positive satisfy
n_i >= m_i = min_{Σ t_q = i} Σ_q A_q(t_q) >= m̃_i, the same minimum over the
lower convex hulls of the A_q (a fractional relaxation). The hull segments are
exactly the ratio rule's merged segments, and m̃_i sums the i smallest
per-positive slopes (negatives / positives of a segment). A positive of a tie
group ending at positive i' >= i earns precision i'/(i' + n_i') <=
i'/(i' + m̃_i') <= i/(i + m̃_i) (m̃_i / i is non-decreasing), hence

    gAP(any interleaving) <= U = (1/P) Σ_{i=1..P} i / (i + m̃_i).

The ratio-rule schedule reaches m̃ at every segment end, so U − C is small
(``ceiling_gap``): it certifies C.

Everything runs on a flat (CSR) layout of the chains without per-block Python
work: the greedy schedule is a stable sort by each block's running maximum
within its chain, and the ratio rule's merging runs in lockstep over all
chains (one numpy step per block position; chains too long for that go
through a plain per-block loop). Results are identical to the textbook
heap / stack formulations (tests compare them). Neither schedule is always
optimal for AP (docs/definitions.md: brute force beats the rule in ~1% of
small cases), hence C <= optimum <= U.
"""

from __future__ import annotations

import numpy as np

from rl_gap.metrics.functional.ranking import global_ap_from_state
from rl_gap.metrics.functional.state import RetrievalState

__all__ = [
    "blocks_from_state",
    "chains_from_state",
    "interleaving_ap",
    "ratio_rule_ap",
    "ratio_rule_order",
    "greedy_ap",
    "upper_bound_ap",
    "ceiling_from_state",
]


def _flat_blocks(state: RetrievalState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Block chains of the queries with positives as ``(gaps (B,), sizes (B,), offsets (C+1,))``.

    A block is one tie group of a query's positives (``sizes``: its positives)
    with the negatives that join the ranking at it (``gaps``: new negatives
    scoring >= the group). Positives are stored by query, then decreasing score,
    so a tie group is a run of equal (query, score).
    """
    query = state.pos_query.cpu().numpy()
    scores = state.pos_scores.cpu().numpy()
    neg_ge = state.pos_neg_ge.cpu().numpy().astype(np.int64)
    total = query.size
    if total == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(1, dtype=np.int64)
    first = np.ones(total, dtype=bool)
    first[1:] = (query[1:] != query[:-1]) | (scores[1:] != scores[:-1])
    starts = np.flatnonzero(first)
    sizes = np.diff(np.append(starts, total)).astype(np.int64)
    block_neg = neg_ge[starts]
    per_query = np.bincount(query[starts], minlength=state.num_queries)
    per_query = per_query[per_query > 0]
    offsets = np.zeros(per_query.size + 1, dtype=np.int64)
    np.cumsum(per_query, out=offsets[1:])
    gaps = block_neg.copy()
    gaps[1:] -= block_neg[:-1]
    gaps[offsets[:-1]] = block_neg[offsets[:-1]]
    return gaps, sizes, offsets


def _concat(
    chains: list[np.ndarray], sizes: list[np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lists of chains (and block sizes, default 1) -> ``(gaps, sizes, offsets)``."""
    lengths = np.asarray([c.size for c in chains], dtype=np.int64)
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if not chains or offsets[-1] == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, offsets
    gaps = np.concatenate([np.asarray(c, dtype=np.int64) for c in chains])
    if sizes is None:
        return gaps, np.ones_like(gaps), offsets
    if len(sizes) != len(chains) or any(len(k) != len(c) for k, c in zip(sizes, chains)):
        raise ValueError("sizes must give one positive count per block of every chain")
    flat_sizes = np.concatenate([np.asarray(k, dtype=np.int64) for k in sizes])
    if flat_sizes.size and flat_sizes.min() < 1:
        raise ValueError("every block holds at least one positive (sizes >= 1)")
    return gaps, flat_sizes, offsets


def blocks_from_state(state: RetrievalState) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per query with positives: (negatives joining at each tie group, positives in it)."""
    gaps, sizes, offsets = _flat_blocks(state)
    cut = offsets[1:-1]
    if offsets.size <= 1:
        return [], []
    return np.split(gaps, cut), np.split(sizes, cut)


def chains_from_state(state: RetrievalState) -> list[np.ndarray]:
    """Per query with positives: (m,) int64 negatives before each successive positive.

    The per-positive view (tied positives one after another); the ceiling itself
    works on tie-group blocks (``blocks_from_state``).
    """
    neg_ge = state.pos_neg_ge.cpu().numpy().astype(np.int64)
    counts = state.num_positives.cpu().numpy()
    counts = counts[counts > 0].astype(np.int64)
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    gaps = neg_ge.copy()
    if gaps.size:
        gaps[1:] -= neg_ge[:-1]
        gaps[offsets[:-1]] = neg_ge[offsets[:-1]]
    return np.split(gaps, offsets[1:-1]) if offsets.size > 1 else []


def interleaving_ap(gaps_in_order: np.ndarray, sizes_in_order: np.ndarray | None = None) -> float:
    """AP of a merged list of blocks: ``gaps`` negatives, then ``sizes`` tied positives each.

    Every positive of a block gets the precision at the block's end (gAP's ties).
    """
    gaps = np.asarray(gaps_in_order, dtype=np.float64)
    sizes = np.ones_like(gaps) if sizes_in_order is None else np.asarray(sizes_in_order, float)
    if gaps.size == 0:
        return float("nan")
    hits = np.cumsum(sizes)
    items = np.cumsum(gaps + sizes)
    return float(np.sum(sizes * hits / items) / hits[-1])


def _segment_ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each (s, n)."""
    total = int(sizes.sum())
    before = np.cumsum(sizes) - sizes
    return np.repeat(starts - before, sizes) + np.arange(total, dtype=np.int64)


def _pav_python(gaps, sizes, offsets, chain_ids, spos, slen, sfirst, top) -> None:
    """Per-block stack merging for the given chains (writes their stacks in place)."""
    for c in chain_ids.tolist():
        base = int(offsets[c])
        stack: list[list[int]] = []  # [positives, length, first block]
        end = offsets[c + 1]
        for j, (gap, k) in enumerate(zip(gaps[base:end].tolist(), sizes[base:end].tolist())):
            stack.append([k, gap + k, j])
            # Merge while the newer segment is denser than the one before it.
            while len(stack) > 1 and stack[-1][0] * stack[-2][1] > stack[-2][0] * stack[-1][1]:
                pos, length, _ = stack.pop()
                stack[-1][0] += pos
                stack[-1][1] += length
        for k, (pos, length, first) in enumerate(stack):
            spos[base + k], slen[base + k], sfirst[base + k] = pos, length, first
        top[c] = len(stack)


def _pav_lockstep(gaps, sizes, offsets, chain_ids, spos, slen, sfirst, top) -> None:
    """The same merging as ``_pav_python``, all chains advanced one block per step.

    Chain c's stack lives at ``spos[offsets[c] : offsets[c] + top[c]]`` (a stack
    never outgrows its chain). Chains are sorted by decreasing length, so the
    chains still active at block j are a prefix.
    """
    if chain_ids.size == 0:
        return
    lengths = offsets[chain_ids + 1] - offsets[chain_ids]
    order = np.argsort(-lengths, kind="stable")
    ids, lengths = chain_ids[order], lengths[order]
    base = offsets[ids]
    height = np.zeros(ids.size, dtype=np.int64)
    active_after = np.searchsorted(-lengths, -np.arange(int(lengths[0])), side="left")
    for j in range(int(lengths[0])):
        n = int(active_after[j])  # chains with more than j blocks
        slot = base[:n] + height[:n]
        block = base[:n] + j
        spos[slot] = sizes[block]
        slen[slot] = gaps[block] + sizes[block]
        sfirst[slot] = j
        height[:n] += 1
        cand = np.arange(n)
        while cand.size:
            cand = cand[height[cand] > 1]
            upper = base[cand] + height[cand] - 1
            lower = upper - 1
            denser = spos[upper] * slen[lower] > spos[lower] * slen[upper]
            cand, upper, lower = cand[denser], upper[denser], lower[denser]
            spos[lower] += spos[upper]
            slen[lower] += slen[upper]
            height[cand] -= 1
    top[ids] = height


def _segments(
    gaps: np.ndarray, sizes: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Ratio-rule segments by decreasing density (stable).

    Returns per segment ``(chain, first block, blocks, positives, items)``.
    """
    num_chains = offsets.size - 1
    total = int(offsets[-1])
    lengths = offsets[1:] - offsets[:-1]
    spos = np.zeros(total, dtype=np.int64)
    slen = np.zeros(total, dtype=np.int64)
    sfirst = np.zeros(total, dtype=np.int64)
    top = np.zeros(num_chains, dtype=np.int64)
    # A lockstep step costs ~tens of us whatever its width; very long chains are
    # cheaper one block at a time.
    long_chain = lengths > max(64, total // 128)
    args = (spos, slen, sfirst, top)
    _pav_python(gaps, sizes, offsets, np.nonzero(long_chain)[0], *args)
    _pav_lockstep(gaps, sizes, offsets, np.nonzero(~long_chain & (lengths > 0))[0], *args)
    # Segments in (chain, stack position) order, then by decreasing density (stable).
    seg_chain = np.repeat(np.arange(num_chains, dtype=np.int64), top)
    seg_slot = _segment_ranges(offsets[:-1], top)
    seg_first = sfirst[seg_slot]
    seg_end = np.append(seg_first[1:], 0)
    last = np.cumsum(top)[top > 0] - 1
    seg_end[last] = lengths[top > 0]
    seg_blocks = seg_end - seg_first
    seg_pos, seg_len = spos[seg_slot], slen[seg_slot]
    order = np.argsort(-(seg_pos / np.maximum(seg_len, 1)), kind="stable")
    return seg_chain[order], seg_first[order], seg_blocks[order], seg_pos[order], seg_len[order]


def _ratio_rule_flat(gaps, sizes, offsets) -> tuple[np.ndarray, np.ndarray]:
    """Ratio-rule schedule on flat chains: ``(chain (B,), block (B,))`` in merged order."""
    chain, first, blocks, _, _ = _segments(gaps, sizes, offsets)
    return np.repeat(chain, blocks), _segment_ranges(first, blocks)


def ratio_rule_order(
    chains: list[np.ndarray], sizes: list[np.ndarray] | None = None
) -> list[tuple[int, int]]:
    """Ratio-rule schedule: (chain, block) pairs in merged order.

    Per chain, pool-adjacent-violators merging of consecutive blocks until the
    densities (positives / items) are non-increasing; then every segment by
    decreasing density (stable). ``sizes``: positives per block (default 1).
    """
    chain, block = _ratio_rule_flat(*_concat(chains, sizes))
    return list(zip(chain.tolist(), block.tolist()))


def _chains_ap(flat_ap, chains: list[np.ndarray], sizes: list[np.ndarray] | None) -> float:
    """``flat_ap`` (one of the ``_*_flat`` below, which need >= 1 block) on listed chains;
    NaN without a block."""
    gaps, flat_sizes, offsets = _concat(chains, sizes)
    return float("nan") if gaps.size == 0 else flat_ap(gaps, flat_sizes, offsets)


def _ratio_rule_ap_flat(gaps, sizes, offsets) -> float:
    chain, block = _ratio_rule_flat(gaps, sizes, offsets)
    index = offsets[chain] + block
    return interleaving_ap(gaps[index], sizes[index])


def ratio_rule_ap(chains: list[np.ndarray], sizes: list[np.ndarray] | None = None) -> float:
    """gAP of the ratio-rule schedule (``ratio_rule_order``)."""
    return _chains_ap(_ratio_rule_ap_flat, chains, sizes)


def _greedy_ap_flat(gaps, sizes, offsets) -> float:
    # Popping the head with the fewest negatives (ties: lower chain, then earlier
    # block) takes blocks in increasing (running max of the chain so far, chain,
    # block): a block below its chain's running max follows the block that set it
    # at once. Chains are laid out in (chain, block) order, so a stable sort by the
    # running max gives exactly that order.
    lengths = offsets[1:] - offsets[:-1]
    shift = int(gaps.max()) + 1  # gaps >= 0: chain c's values live in [c*shift, (c+1)*shift)
    chain = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    running = np.maximum.accumulate(gaps + chain * shift) - chain * shift
    order = np.argsort(running, kind="stable")
    return interleaving_ap(gaps[order], sizes[order])


def greedy_ap(chains: list[np.ndarray], sizes: list[np.ndarray] | None = None) -> float:
    """gAP of the greedy schedule: always the head block with the fewest negatives."""
    return _chains_ap(_greedy_ap_flat, chains, sizes)


def _upper_bound_flat(gaps, sizes, offsets) -> float:
    _, _, _, seg_pos, seg_len = _segments(gaps, sizes, offsets)
    # Hull slopes (negatives per positive) in increasing order, one per positive.
    slope = np.repeat((seg_len - seg_pos) / seg_pos, seg_pos)
    rank = np.arange(1, slope.size + 1, dtype=np.float64)
    return float(np.mean(rank / (rank + np.cumsum(slope))))


def upper_bound_ap(chains: list[np.ndarray], sizes: list[np.ndarray] | None = None) -> float:
    """U >= the gAP of every interleaving of the chains (module docstring)."""
    return _chains_ap(_upper_bound_flat, chains, sizes)


def ceiling_from_state(state: RetrievalState) -> dict[str, float]:
    """C = max(ratio rule, greedy, observed gAP) <= best interleaving's gAP <= U.

    Returns ``{"ceiling", "ceiling_rule", "ceiling_greedy", "ceiling_upper",
    "ceiling_gap"}``: C, the two schedules, the upper bound U and U − C (NaN
    without positives). U is reported as max(U, C): the two agree up to float
    rounding when the rule is exact.
    Cost: O(B log B) time for B tie groups of positives, vectorised numpy.
    """
    flat = _flat_blocks(state)
    if flat[0].size == 0:
        nan = float("nan")
        keys = ("ceiling", "ceiling_rule", "ceiling_greedy", "ceiling_upper", "ceiling_gap")
        return dict.fromkeys(keys, nan)
    rule = _ratio_rule_ap_flat(*flat)
    greedy = _greedy_ap_flat(*flat)
    observed = float(global_ap_from_state(state))
    lower = max(rule, greedy, observed)
    upper = max(_upper_bound_flat(*flat), lower)
    return {
        "ceiling": lower,
        "ceiling_rule": rule,
        "ceiling_greedy": greedy,
        "ceiling_upper": upper,
        "ceiling_gap": upper - lower,
    }
