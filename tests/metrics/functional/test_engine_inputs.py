"""Engine inputs: label positives, block-wise relevance functions and row indices against
Python loops; bad inputs are named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_gap.metrics.functional.engine_inputs import (
    as_tensor,
    check_embeddings,
    check_labels,
    check_rows,
    positive_pairs_from_labels,
    relevant_pairs_from_fn,
    same_data,
)


@pytest.mark.parametrize("exclude_self", [False, True])
def test_positive_pairs_are_every_equal_label_pair_in_query_order(exclude_self):
    database = torch.tensor([0, 0, 1, 2, 2, 2, 4])  # sorted, as the engine passes it
    queries = database if exclude_self else torch.tensor([2, 3, 0, 4])
    q_idx, d_idx = positive_pairs_from_labels(queries, database, exclude_self)
    expected = [
        (i, j)
        for i, a in enumerate(queries.tolist())
        for j, b in enumerate(database.tolist())
        if a == b and not (exclude_self and i == j)
    ]
    assert list(zip(q_idx.tolist(), d_idx.tolist())) == expected


def test_relevance_function_is_called_block_by_block():
    calls = []

    def divisible(rows, cols):
        calls.append((rows.numel(), cols.numel()))
        return (rows[:, None] + cols[None, :]) % 3 == 0

    q_idx, d_idx = relevant_pairs_from_fn(divisible, 5, 7, block_size=3)
    expected = [(i, j) for i in range(5) for j in range(7) if (i + j) % 3 == 0]
    assert sorted(zip(q_idx.tolist(), d_idx.tolist())) == expected
    assert max(r * c for r, c in calls) <= 9  # never the whole grid
    with pytest.raises(ValueError, match=r"must return a bool \(3, 3\) tensor"):
        relevant_pairs_from_fn(lambda r, c: torch.ones(3, 3), 5, 7, block_size=3)


def test_numpy_inputs_share_memory_and_views_are_recognised():
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    t = as_tensor(x, "x")
    assert t.data_ptr() == x.ctypes.data and same_data(t, as_tensor(x, "x"))
    assert not same_data(t, t.clone())


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: as_tensor(np.array(["a"]), "labels"), "labels must be numeric"),
        (lambda: as_tensor([1.0], "queries"), "must be a torch.Tensor or numpy array"),
        (lambda: check_embeddings(torch.zeros(3), "q"), r"q must be 2-D \(N, dim\)"),
        (lambda: check_embeddings(torch.zeros(0, 2), "q"), "q is empty"),
        (lambda: check_embeddings(torch.zeros(2, 2, dtype=torch.long), "q"), "floating point"),
        (lambda: check_embeddings(torch.tensor([[0.0, float("inf")]]), "q"), "NaN or inf"),
        (lambda: check_labels(torch.tensor([0.5, 1.0]), 2, "y"), "never truncated"),
        (lambda: check_labels(torch.tensor([0, 1]), 3, "y"), "y has length 2, expected 3"),
        (lambda: check_rows(torch.tensor([0, 5]), 5, "rows"), r"out of range \[0, 5\)"),
        (lambda: check_rows(torch.tensor([0.0]), 5, "rows"), "1-D integer index"),
    ],
)
def test_bad_inputs_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
