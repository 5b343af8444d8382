"""Negative dropping over a sharded list (rl_gap/losses/sharding/drop.py): the order-preserving
keys against float comparisons, and the radix select and keep mask on one gloo rank against a
Python sort by (score, flat position)."""

from __future__ import annotations

import pytest
import torch

from rl_gap.losses.fast_sap import binning as fast_binning
from rl_gap.losses.sharding.drop import select_kth, sharded_drop_mask, signed_keys

from ..sap_refs import brute_drop


def tie_heavy(dtype, n: int = 60, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    scores = (torch.randint(-4, 5, (n,), generator=gen) / 4.0).to(dtype)
    scores[::9] = -0.0
    positive = torch.rand(n, generator=gen) < 0.2
    valid = torch.rand(n, generator=gen) > 0.1
    return scores, positive, valid


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_keys_order_like_the_floats(dtype):
    values = torch.tensor([-3.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, 7e10], dtype=dtype)
    keys = signed_keys(values)
    for i in range(len(values)):
        for j in range(len(values)):
            assert bool(keys[i] < keys[j]) == bool(values[i] < values[j]), (i, j)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_select_kth_is_the_sorted_kth_negative(one_rank_group, dtype):
    scores, positive, _ = tie_heavy(dtype)
    negatives = sorted(float(s) for s, p in zip(scores, positive) if not p)
    for k in (1, 7, len(negatives)):
        value, rank_in_ties, ties = select_kth(scores, ~positive, k)
        assert value == negatives[k - 1]
        assert ties == negatives.count(value)
        assert rank_in_ties == k - sum(1 for v in negatives if v < value)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("rate", [0.1, 0.37, 0.9])
def test_keep_mask_is_the_sorted_selection(one_rank_group, monkeypatch, native, rate):
    monkeypatch.setattr(fast_binning, "USE_NATIVE", native)
    scores, positive, valid = tie_heavy(torch.float32, seed=int(rate * 100))
    keep = sharded_drop_mask(scores, positive, valid, rate)
    index = valid.nonzero().squeeze(1).tolist()
    kept = brute_drop([(i, bool(positive[i])) for i in index],
                      {i: float(scores[i]) for i in index}, rate)  # fmt: skip
    assert keep.nonzero().squeeze(1).tolist() == sorted(kept)
    with pytest.raises(ValueError, match="neg_drop"):
        sharded_drop_mask(scores, positive, valid, 1.0)
