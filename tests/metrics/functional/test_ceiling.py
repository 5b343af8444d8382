"""Vectorised ceiling schedules == their textbook heap / stack formulations.

The engine's greedy schedule is a stable sort by running maxima and its ratio
rule merges all chains in lockstep; both must reproduce, block for block, the
plain one-block-at-a-time algorithms written out below (ties included).
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest
import torch

from rl_gap.metrics.functional import state_from_scores
from rl_gap.metrics.functional.ceiling import (
    blocks_from_state,
    ceiling_from_state,
    chains_from_state,
    greedy_ap,
    ratio_rule_ap,
    ratio_rule_order,
)
from rl_gap.metrics.functional.state import unique_sorted


def _ap(gaps: list[int], sizes: list[int] | None = None) -> float:
    """AP of blocks in order: gap negatives, then `size` tied positives (precision at block end)."""
    sizes = [1] * len(gaps) if sizes is None else sizes
    items, hits, total = 0, 0, 0.0
    for gap, size in zip(gaps, sizes):
        items += gap + size
        hits += size
        total += size * hits / items
    return total / hits


def _greedy_reference(chains: list[np.ndarray]) -> list[tuple[int, int]]:
    """Pop the head block with the fewest negatives (ties: lower chain, earlier block)."""
    heap = [(int(g[0]), c, 0) for c, g in enumerate(chains) if g.size]
    heapq.heapify(heap)
    out = []
    while heap:
        gap, c, j = heapq.heappop(heap)
        out.append((c, j))
        if j + 1 < chains[c].size:
            heapq.heappush(heap, (int(chains[c][j + 1]), c, j + 1))
    return out


def _ratio_rule_reference(chains, sizes=None) -> list[tuple[int, int]]:
    """Per chain, merge adjacent blocks while the later one is strictly denser;
    then all segments by decreasing density, ties in (chain, position) order."""
    sizes = [np.ones_like(c) for c in chains] if sizes is None else sizes
    segments = []  # (positives, length, chain, first block, blocks)
    for c, gaps in enumerate(chains):
        stack: list[list[int]] = []
        for j, (gap, k) in enumerate(zip(gaps.tolist(), sizes[c].tolist())):
            stack.append([k, gap + k, j, 1])
            while len(stack) > 1 and stack[-1][0] * stack[-2][1] > stack[-2][0] * stack[-1][1]:
                pos, length, _, blocks = stack.pop()
                stack[-1][0] += pos
                stack[-1][1] += length
                stack[-1][3] += blocks
        segments += [(pos, length, c, first, n) for pos, length, first, n in stack]
    segments.sort(key=lambda s: -(s[0] / s[1]))  # list.sort is stable
    return [(c, first + j) for _, _, c, first, n in segments for j in range(n)]


def _pick(order, gaps, sizes) -> tuple[list[int], list[int]]:
    """The (gaps, sizes) of the blocks ``(chain, block)`` in ``order``."""
    return [int(gaps[c][j]) for c, j in order], [int(sizes[c][j]) for c, j in order]


def _random_chains(rng: np.random.Generator) -> list[np.ndarray]:
    high = int(rng.choice([1, 2, 3, 8, 60]))  # small ranges: many equal gaps / densities
    chains = [rng.integers(0, high, int(rng.integers(0, 10))) for _ in range(rng.integers(0, 9))]
    if chains and rng.random() < 0.3:  # a long chain takes the per-block path
        chains[int(rng.integers(len(chains)))] = rng.integers(0, high, int(rng.integers(80, 300)))
    return chains


def test_greedy_and_ratio_rule_match_reference_schedules():
    rng = np.random.default_rng(7)
    for _ in range(600):
        chains = _random_chains(rng)
        total = sum(c.size for c in chains)
        rule_order = _ratio_rule_reference(chains)
        assert ratio_rule_order(chains) == rule_order
        greedy = _greedy_reference(chains)
        if total == 0:
            assert np.isnan(ratio_rule_ap(chains)) and np.isnan(greedy_ap(chains))
            continue
        assert ratio_rule_ap(chains) == pytest.approx(
            _ap([int(chains[c][j]) for c, j in rule_order]), abs=1e-12
        )
        assert greedy_ap(chains) == pytest.approx(
            _ap([int(chains[c][j]) for c, j in greedy]), abs=1e-12
        )
        # Blocks of several tied positives: the same schedules, weighted.
        sizes = [rng.integers(1, 4, c.size) for c in chains]
        rule_order = _ratio_rule_reference(chains, sizes)
        assert ratio_rule_order(chains, sizes) == rule_order
        rule_ap = _ap(*_pick(rule_order, chains, sizes))
        assert ratio_rule_ap(chains, sizes) == pytest.approx(rule_ap, abs=1e-12)
        greedy_ap_ref = _ap(*_pick(greedy, chains, sizes))
        assert greedy_ap(chains, sizes) == pytest.approx(greedy_ap_ref, abs=1e-12)


def test_ceiling_from_state_matches_reference_on_tied_scores():
    g = torch.Generator().manual_seed(3)
    for shape, rate, levels in [((40, 60), 0.3, 5), ((3, 900), 0.4, 50), ((25, 30), 0.05, 3)]:
        scores = torch.round(torch.rand(*shape, generator=g, dtype=torch.float64) * levels)
        rel = torch.rand(*shape, generator=g) < rate
        state = state_from_scores(scores, rel)
        # Chains straight from the matrix: per query, pessimistic ties (negatives first).
        chains, blocks, sizes = [], [], []
        for q in range(shape[0]):
            pos = sorted(scores[q][rel[q]].tolist(), reverse=True)
            neg = scores[q][~rel[q]]
            ge = [int((neg >= s).sum()) for s in pos]
            if ge:
                chains.append(np.diff(np.asarray(ge), prepend=0))
                levels_q = sorted(set(pos), reverse=True)  # one block per tie group
                ge_q = [int((neg >= s).sum()) for s in levels_q]
                blocks.append(np.diff(np.asarray(ge_q), prepend=0))
                sizes.append(np.asarray([pos.count(s) for s in levels_q]))
        got = chains_from_state(state)
        assert len(got) == len(chains) and all(map(np.array_equal, got, chains))
        got_blocks, got_sizes = blocks_from_state(state)
        assert all(map(np.array_equal, got_blocks, blocks))
        assert all(map(np.array_equal, got_sizes, sizes))
        out = ceiling_from_state(state)
        rule = _ap(*_pick(_ratio_rule_reference(blocks, sizes), blocks, sizes))
        greedy = _ap(*_pick(_greedy_reference(blocks), blocks, sizes))
        assert out["ceiling_rule"] == pytest.approx(rule, abs=1e-12)
        assert out["ceiling_greedy"] == pytest.approx(greedy, abs=1e-12)
        assert out["ceiling"] >= max(out["ceiling_rule"], out["ceiling_greedy"])


def test_unique_sorted_integers_and_floats():
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.int64, torch.int32, torch.float32):
        x = torch.randint(-20, 20, (500,), generator=g).to(dtype)
        expected = sorted(set(x.tolist()))
        assert unique_sorted(x).tolist() == expected
        assert unique_sorted(x[:1]).tolist() == x[:1].tolist()
        assert unique_sorted(x[:0]).numel() == 0
