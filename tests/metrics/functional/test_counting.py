"""NegativeCounter fed a matrix in row and column blocks: per-positive, per-group and
bootstrap-knot negative counts equal a brute-force count (eager and native paths)."""

from __future__ import annotations

import pytest
import torch

from rl_gap.metrics.functional.counting import NegativeCounter, suffix_sum
from rl_gap.metrics.functional.dense import prepare_positives


@pytest.mark.parametrize("native", [False, True])
def test_block_counts_equal_brute_force(native):
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 7, (6, 20), generator=g).double()  # ties on purpose
    rel = torch.rand(6, 20, generator=g) < 0.3
    rel[:, 0] = True  # every query has a positive
    group = torch.tensor([0, 1, 1, 0, 2, 1])
    q_idx, d_idx = rel.nonzero(as_tuple=True)
    _, pos_query, pos_scores, offsets, grid, index = prepare_positives(
        q_idx, scores[q_idx, d_idx], 6
    )
    knots = torch.tensor([0, grid.numel() - 1])
    counter = NegativeCounter(grid, offsets, index, group, 3, knots)
    counter.force_native = native
    negatives = scores.masked_fill(rel, float("-inf"))
    for r0, r1 in ((0, 4), (4, 6)):
        for c0, c1 in ((0, 7), (7, 20)):
            counter.add(negatives[r0:r1, c0:c1].contiguous(), r0)
    pos_neg_ge, grid_neg_ge, boot = counter.finish()
    negative = ~rel
    expected = [int((negative[q] & (scores[q] >= s)).sum()) for q, s in zip(pos_query, pos_scores)]
    assert pos_neg_ge.tolist() == expected
    for k in range(3):
        rows = group == k
        at_grid = [int((negative[rows] & (scores[rows] >= t)).sum()) for t in grid]
        assert grid_neg_ge[k].tolist() == at_grid
    for q in range(6):
        at_knots = [int((negative[q] & (scores[q] >= grid[i])).sum()) for i in knots]
        assert boot[q].tolist() == at_knots


def test_suffix_sum():
    assert suffix_sum(torch.tensor([[1, 2, 3], [0, 0, 5]])).tolist() == [[6, 5, 3], [5, 5, 5]]
