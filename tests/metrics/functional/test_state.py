"""State helpers: stable sorts, distinct values, tie runs and scoring dtypes against numpy
and plain Python loops."""

from __future__ import annotations

import pytest
import torch

from rl_gap.metrics.functional.state import (
    argsort_stable,
    compute_dtype_for,
    tie_group_end,
    unique_sorted,
)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.float64])
@pytest.mark.parametrize("descending", [False, True])
def test_argsort_is_stable_in_both_directions(dtype, descending):
    x = torch.randint(-3, 4, (200,), generator=torch.Generator().manual_seed(0)).to(dtype)
    values = x.tolist()
    # Python's sort is stable; reversing the key (not the list) keeps ties in input order.
    expected = sorted(range(200), key=lambda i: -values[i] if descending else values[i])
    assert argsort_stable(x, descending=descending).tolist() == expected


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.float32])
def test_unique_sorted_and_inverse(dtype):
    x = torch.randint(0, 9, (100,), generator=torch.Generator().manual_seed(1)).to(dtype)
    expected = sorted(set(x.tolist()))
    assert unique_sorted(x).tolist() == expected
    values, inverse = unique_sorted(x, return_inverse=True)
    assert values.tolist() == expected and torch.equal(values[inverse], x)
    assert unique_sorted(torch.zeros(0, dtype=dtype)).numel() == 0


def test_tie_group_end_marks_the_last_index_of_each_run_of_equal_key_tuples():
    a = torch.tensor([1, 1, 1, 2, 2, 3, 3, 3])
    b = torch.tensor([0, 0, 5, 5, 5, 1, 1, 2])
    expected = []
    for i in range(len(a)):
        j = i
        while j + 1 < len(a) and (a[j + 1], b[j + 1]) == (a[i], b[i]):
            j += 1
        expected.append(j)
    assert tie_group_end([a, b]).tolist() == expected == [1, 1, 2, 4, 4, 6, 6, 7]
    assert tie_group_end([torch.zeros(0)]).numel() == 0


def test_scoring_dtypes():
    assert compute_dtype_for(torch.float64) == torch.float64
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert compute_dtype_for(dtype) == torch.float32
    with pytest.raises(ValueError, match="must be floating point, got dtype torch.int64"):
        compute_dtype_for(torch.int64)
