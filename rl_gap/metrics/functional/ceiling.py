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

Neither is always optimal for AP, so **C is a lower bound on the true
maximum** (DESIGN §4: brute force beats the rule in ~1% of small cases). Ties
inside a query list are taken pessimistically (tied negatives first), as in gAP,
so C >= gAP always.
"""

from __future__ import annotations

import heapq

import numpy as np

from rl_gap.metrics.functional.state import RetrievalState

__all__ = [
    "chains_from_state",
    "interleaving_ap",
    "ratio_rule_ap",
    "greedy_ap",
    "ceiling_from_state",
]


def chains_from_state(state: RetrievalState) -> list[np.ndarray]:
    """Per query with positives: (m,) int64 negatives before each successive positive."""
    neg_ge = state.pos_neg_ge.cpu().numpy()
    counts = state.num_positives.cpu().numpy()
    chains, start = [], 0
    for count in counts:
        if count:
            ge = neg_ge[start : start + count]
            chains.append(np.diff(ge, prepend=0))
        start += count
    return chains


def interleaving_ap(gaps_in_order: np.ndarray) -> float:
    """AP of a merged list given, for each positive in order, the negatives right before it."""
    items = np.cumsum(gaps_in_order + 1, dtype=np.float64)
    hits = np.arange(1, gaps_in_order.size + 1, dtype=np.float64)
    return float(np.mean(hits / items)) if gaps_in_order.size else float("nan")


def ratio_rule_order(chains: list[np.ndarray]) -> list[tuple[int, int]]:
    """Ratio-rule schedule: (chain, block) pairs in merged order.

    Per chain, pool-adjacent-violators merging of consecutive blocks until the
    densities (positives / items) are non-increasing; then every segment by
    decreasing density (stable).
    """
    seg_pos, seg_len, seg_chain, seg_first = [], [], [], []
    for chain_id, gaps in enumerate(chains):
        stack: list[list[int]] = []  # [positives, length, first block]
        for j, gap in enumerate(gaps.tolist()):
            stack.append([1, gap + 1, j])
            # Merge while the newer segment is denser than the one before it.
            while len(stack) > 1 and stack[-1][0] * stack[-2][1] > stack[-2][0] * stack[-1][1]:
                pos, length, _ = stack.pop()
                stack[-1][0] += pos
                stack[-1][1] += length
        for pos, length, first in stack:
            seg_pos.append(pos)
            seg_len.append(length)
            seg_chain.append(chain_id)
            seg_first.append(first)
    if not seg_pos:
        return []
    density = np.asarray(seg_pos, dtype=np.float64) / np.asarray(seg_len, dtype=np.float64)
    order = np.argsort(-density, kind="stable")
    return [(seg_chain[s], seg_first[s] + j) for s in order.tolist() for j in range(seg_pos[s])]


def ratio_rule_ap(chains: list[np.ndarray]) -> float:
    """gAP of the ratio-rule schedule (``ratio_rule_order``)."""
    order = ratio_rule_order(chains)
    return interleaving_ap(np.asarray([chains[c][j] for c, j in order], dtype=np.int64))


def greedy_ap(chains: list[np.ndarray]) -> float:
    """gAP of the greedy schedule: always the head block with the fewest negatives."""
    heap = [(int(gaps[0]), cid, 0) for cid, gaps in enumerate(chains) if gaps.size]
    heapq.heapify(heap)
    out = []
    while heap:
        gap, cid, j = heapq.heappop(heap)
        out.append(gap)
        if j + 1 < chains[cid].size:
            heapq.heappush(heap, (int(chains[cid][j + 1]), cid, j + 1))
    return interleaving_ap(np.asarray(out, dtype=np.int64))


def ceiling_from_state(state: RetrievalState) -> dict[str, float]:
    """C = max(ratio rule, greedy) — a lower bound on the best interleaving's gAP.

    Returns ``{"ceiling", "ceiling_rule", "ceiling_greedy"}`` (NaN without positives).
    Cost: O(P log P) time, P positive pairs, in numpy / Python loops.
    """
    chains = chains_from_state(state)
    rule = ratio_rule_ap(chains)
    greedy = greedy_ap(chains)
    return {"ceiling": max(rule, greedy), "ceiling_rule": rule, "ceiling_greedy": greedy}
