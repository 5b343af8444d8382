"""Consistency ceiling C and efficiency gAP / C (gSAP paper, App. E).

For fixed per-query rankings, C is the largest gAP over order-preserving
interleavings of the per-query ranked lists. An optimal interleaving puts each
positive right after the negatives of its own query that precede it, so each
query is a chain of blocks (a_j negatives, then positive j); trailing
negatives and distractor queries go last and do not matter.

Two schedules are evaluated and the larger gAP is reported:

- the *ratio rule*: pool-adjacent-violators merging of consecutive blocks of a
  chain until densities (positives / items) are non-increasing, then all
  segments by decreasing density (Sidney's ratio rule);
- a *greedy* schedule: repeatedly take the chain head block with the fewest
  negatives.

Both run on a flat (CSR) layout of the chains without per-positive Python
work: the greedy schedule is a stable sort by each block's running maximum
within its chain, and the ratio rule's merging runs in lockstep over all
chains (one numpy step per block position; chains too long for that go
through a plain per-block loop). Results are identical to the textbook
heap / stack formulations (tests compare them).

Neither is always optimal for AP, so **C is a lower bound on the true
maximum** (docs/definitions.md: brute force beats the rule in ~1% of small cases). Ties
inside a query list are taken pessimistically (tied negatives first), as in gAP,
so C >= gAP always.
"""

from __future__ import annotations

import numpy as np

from rl_gap.metrics.functional.state import RetrievalState

__all__ = [
    "chains_from_state",
    "interleaving_ap",
    "ratio_rule_ap",
    "greedy_ap",
    "ceiling_from_state",
]


def _flat_gaps(neg_ge: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Chains of the queries with positives as ``(gaps (P,), offsets (C+1,))``."""
    counts = counts[counts > 0].astype(np.int64)
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    gaps = np.asarray(neg_ge, dtype=np.int64).copy()
    if gaps.size:
        gaps[1:] -= neg_ge[:-1]
        gaps[offsets[:-1]] = neg_ge[offsets[:-1]]
    return gaps, offsets


def _concat(chains: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """List of chains -> ``(gaps (P,), offsets (C+1,))`` (empty chains kept)."""
    sizes = np.asarray([c.size for c in chains], dtype=np.int64)
    offsets = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if not chains or offsets[-1] == 0:
        return np.zeros(0, dtype=np.int64), offsets
    return np.concatenate([np.asarray(c, dtype=np.int64) for c in chains]), offsets


def chains_from_state(state: RetrievalState) -> list[np.ndarray]:
    """Per query with positives: (m,) int64 negatives before each successive positive."""
    gaps, offsets = _flat_gaps(state.pos_neg_ge.cpu().numpy(), state.num_positives.cpu().numpy())
    return np.split(gaps, offsets[1:-1]) if offsets.size > 1 else []


def interleaving_ap(gaps_in_order: np.ndarray) -> float:
    """AP of a merged list given, for each positive in order, the negatives right before it."""
    items = np.cumsum(gaps_in_order + 1, dtype=np.float64)
    hits = np.arange(1, gaps_in_order.size + 1, dtype=np.float64)
    return float(np.mean(hits / items)) if gaps_in_order.size else float("nan")


def _segment_ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each (s, n)."""
    total = int(sizes.sum())
    before = np.cumsum(sizes) - sizes
    return np.repeat(starts - before, sizes) + np.arange(total, dtype=np.int64)


def _pav_python(gaps, offsets, chain_ids, spos, slen, sfirst, top) -> None:
    """Per-block stack merging for the given chains (writes their stacks in place)."""
    for c in chain_ids.tolist():
        base = int(offsets[c])
        stack: list[list[int]] = []  # [positives, length, first block]
        for j, gap in enumerate(gaps[base : offsets[c + 1]].tolist()):
            stack.append([1, gap + 1, j])
            # Merge while the newer segment is denser than the one before it.
            while len(stack) > 1 and stack[-1][0] * stack[-2][1] > stack[-2][0] * stack[-1][1]:
                pos, length, _ = stack.pop()
                stack[-1][0] += pos
                stack[-1][1] += length
        for k, (pos, length, first) in enumerate(stack):
            spos[base + k], slen[base + k], sfirst[base + k] = pos, length, first
        top[c] = len(stack)


def _pav_lockstep(gaps, offsets, chain_ids, spos, slen, sfirst, top) -> None:
    """The same merging as ``_pav_python``, all chains advanced one block per step.

    Chain c's stack lives at ``spos[offsets[c] : offsets[c] + top[c]]`` (a stack
    never outgrows its chain). Chains are sorted by decreasing length, so the
    chains still active at block j are a prefix.
    """
    if chain_ids.size == 0:
        return
    sizes = offsets[chain_ids + 1] - offsets[chain_ids]
    order = np.argsort(-sizes, kind="stable")
    ids, sizes = chain_ids[order], sizes[order]
    base = offsets[ids]
    height = np.zeros(ids.size, dtype=np.int64)
    active_after = np.searchsorted(-sizes, -np.arange(int(sizes[0])), side="left")
    for j in range(int(sizes[0])):
        n = int(active_after[j])  # chains with more than j blocks
        slot = base[:n] + height[:n]
        spos[slot] = 1
        slen[slot] = gaps[base[:n] + j] + 1
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


def _ratio_rule_flat(gaps: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ratio-rule schedule on flat chains: ``(chain (P,), block (P,))`` in merged order."""
    num_chains = offsets.size - 1
    total = int(offsets[-1])
    sizes = offsets[1:] - offsets[:-1]
    spos = np.zeros(total, dtype=np.int64)
    slen = np.zeros(total, dtype=np.int64)
    sfirst = np.zeros(total, dtype=np.int64)
    top = np.zeros(num_chains, dtype=np.int64)
    # A lockstep step costs ~tens of us whatever its width; very long chains are
    # cheaper one block at a time.
    long_chain = sizes > max(64, total // 128)
    _pav_python(gaps, offsets, np.nonzero(long_chain)[0], spos, slen, sfirst, top)
    _pav_lockstep(gaps, offsets, np.nonzero(~long_chain & (sizes > 0))[0], spos, slen, sfirst, top)
    # Segments in (chain, stack position) order, then by decreasing density (stable).
    seg_chain = np.repeat(np.arange(num_chains, dtype=np.int64), top)
    seg_slot = _segment_ranges(offsets[:-1], top)
    seg_pos = spos[seg_slot]
    if seg_pos.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    density = seg_pos.astype(np.float64) / slen[seg_slot].astype(np.float64)
    order = np.argsort(-density, kind="stable")
    counts = seg_pos[order]
    chain = np.repeat(seg_chain[order], counts)
    block = _segment_ranges(sfirst[seg_slot[order]], counts)
    return chain, block


def ratio_rule_order(chains: list[np.ndarray]) -> list[tuple[int, int]]:
    """Ratio-rule schedule: (chain, block) pairs in merged order.

    Per chain, pool-adjacent-violators merging of consecutive blocks until the
    densities (positives / items) are non-increasing; then every segment by
    decreasing density (stable).
    """
    chain, block = _ratio_rule_flat(*_concat(chains))
    return list(zip(chain.tolist(), block.tolist()))


def _ratio_rule_ap_flat(gaps: np.ndarray, offsets: np.ndarray) -> float:
    chain, block = _ratio_rule_flat(gaps, offsets)
    return interleaving_ap(gaps[offsets[chain] + block])


def ratio_rule_ap(chains: list[np.ndarray]) -> float:
    """gAP of the ratio-rule schedule (``ratio_rule_order``)."""
    return _ratio_rule_ap_flat(*_concat(chains))


def _greedy_ap_flat(gaps: np.ndarray, offsets: np.ndarray) -> float:
    # Popping the head with the fewest negatives (ties: lower chain, then earlier
    # block) takes blocks in increasing (running max of the chain so far, chain,
    # block): a block below its chain's running max follows the block that set it
    # at once. Chains are laid out in (chain, block) order, so a stable sort by the
    # running max gives exactly that order.
    if gaps.size == 0:
        return float("nan")
    sizes = offsets[1:] - offsets[:-1]
    shift = int(gaps.max()) + 1  # gaps >= 0: chain c's values live in [c*shift, (c+1)*shift)
    chain = np.repeat(np.arange(sizes.size, dtype=np.int64), sizes)
    running = np.maximum.accumulate(gaps + chain * shift) - chain * shift
    return interleaving_ap(gaps[np.argsort(running, kind="stable")])


def greedy_ap(chains: list[np.ndarray]) -> float:
    """gAP of the greedy schedule: always the head block with the fewest negatives."""
    return _greedy_ap_flat(*_concat(chains))


def ceiling_from_state(state: RetrievalState) -> dict[str, float]:
    """C = max(ratio rule, greedy) — a lower bound on the best interleaving's gAP.

    Returns ``{"ceiling", "ceiling_rule", "ceiling_greedy"}`` (NaN without positives).
    Cost: O(P log P) time for P positive pairs, vectorised numpy.
    """
    flat = _flat_gaps(state.pos_neg_ge.cpu().numpy(), state.num_positives.cpu().numpy())
    rule = _ratio_rule_ap_flat(*flat)
    greedy = _greedy_ap_flat(*flat)
    return {"ceiling": max(rule, greedy), "ceiling_rule": rule, "ceiling_greedy": greedy}
