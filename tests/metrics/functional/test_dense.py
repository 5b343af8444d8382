"""The materialised-matrix path: input checks, positives ordered per query, the grid with
extra thresholds, and the state's negative counts against a brute-force count."""

from __future__ import annotations

import pytest
import torch

from rl_gap.metrics.functional.dense import (
    check_matrix_inputs,
    merge_grid,
    prepare_positives,
    state_from_scores,
)


def test_negative_counts_at_each_positive_and_grid_value():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 5, (4, 9), generator=g).double()  # ties on purpose
    rel = torch.rand(4, 9, generator=g) < 0.4
    valid = torch.rand(4, 9, generator=g) > 0.2
    state = state_from_scores(scores, rel, valid)
    negative = valid & ~rel
    expected = [
        int((negative[q] & (scores[q] >= s)).sum())
        for q, s in zip(state.pos_query.tolist(), state.pos_scores.tolist())
    ]
    assert state.pos_neg_ge.tolist() == expected
    assert state.grid.tolist() == sorted(set(scores[rel & valid].tolist()))
    assert state.grid_neg_ge[0].tolist() == [
        int((negative & (scores >= t)).sum()) for t in state.grid
    ]


def test_positives_by_query_then_decreasing_score_and_extra_grid_values():
    query = torch.tensor([1, 0, 1, 0, 1])
    scores = torch.tensor([0.2, 0.5, 0.9, 0.5, 0.4])
    order, pos_query, pos_scores, offsets, grid, index = prepare_positives(query, scores, 3)
    assert pos_query.tolist() == [0, 0, 1, 1, 1]
    assert pos_scores.tolist() == pytest.approx([0.5, 0.5, 0.9, 0.4, 0.2])
    assert torch.equal(scores[order], pos_scores) and offsets.tolist() == [0, 2, 5, 5]
    assert torch.equal(grid[index], pos_scores)
    merged, moved = merge_grid(grid, index, torch.tensor([0.45, float("inf"), 0.5]))
    assert merged.tolist() == pytest.approx([0.2, 0.4, 0.45, 0.5, 0.9])
    assert torch.equal(merged[moved], pos_scores)


@pytest.mark.parametrize(
    "scores, rel, valid, message",
    [
        (torch.zeros(2, 3), torch.zeros(2, 2), None, r"rel shape \(2, 2\) does not match"),
        (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3), None, "floating point"),
        (torch.zeros(0, 3), torch.zeros(0, 3), None, "empty query or database set"),
        (torch.zeros(2, 3), torch.full((2, 3), 2), None, "values other than 0/1"),
        (torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), "must be bool"),
        (torch.full((1, 2), float("nan")), torch.zeros(1, 2, dtype=torch.bool), None, "NaN"),
        (torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool), 5, "cut-offs are keyword"),
    ],
)
def test_bad_matrices_are_named(scores, rel, valid, message):
    with pytest.raises(ValueError, match=message):
        check_matrix_inputs(scores, rel, valid)
