"""Deterministic hash sampler and the streaming nested top-T state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_gap.metrics.tail.sampling import (
    NestedTopK,
    hash_uniform,
    part_of,
    sample_mask,
    stream_scores,
)

M64 = (1 << 64) - 1


def _mix(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & M64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def reference_uniform(i: int, seed: int) -> float:
    """SplitMix64-based hash in plain Python integers."""
    key = _mix((seed + 0x9E3779B97F4A7C15) & M64)
    h = _mix(((i & M64) * 0x9E3779B97F4A7C15 + key) & M64)
    return (h >> 11) / float(1 << 53)


def test_hash_matches_plain_integer_reference_and_is_deterministic():
    ids = [0, 1, 2, 17, 123456789, 2**40 + 3, -5]
    got = hash_uniform(np.array(ids, dtype=np.int64), seed=42)
    assert got.tolist() == [reference_uniform(i, 42) for i in ids]
    torch_ids = torch.tensor(ids)
    assert hash_uniform(torch_ids, 42).tolist() == got.tolist()
    assert not np.array_equal(hash_uniform(np.array(ids), 43), got)


def test_sample_rate_nesting_and_errors():
    ids = np.arange(200_000)
    small, large = sample_mask(ids, 0.05, seed=7), sample_mask(ids, 0.2, seed=7)
    assert abs(small.mean() - 0.05) < 4 * np.sqrt(0.05 * 0.95 / ids.size)
    assert not np.any(small & ~large)  # nested
    # Same sample whatever the order or sharding of the pool.
    perm = np.random.default_rng(0).permutation(ids.size)
    assert np.array_equal(sample_mask(ids[perm], 0.05, seed=7), small[perm])
    with pytest.raises(ValueError, match="rate"):
        sample_mask(ids, 0.0)
    with pytest.raises(ValueError, match="integers"):
        hash_uniform(np.array([0.5, 1.5]))


def test_nested_topk_streaming_equals_brute_force():
    g = torch.Generator().manual_seed(0)
    Q, S, T = 7, 5000, 300
    scores = torch.randn(Q, S, generator=g)
    scores[2, 100:400] = 1.5  # ties
    u = torch.rand(S, generator=g, dtype=torch.float64)
    part = part_of(u, (0.125, 0.25, 0.5, 1.0))
    state = NestedTopK(Q, T)
    for start in range(0, S, 173):  # small blocks: exercises the sparse candidate path
        state.push(scores[:, start : start + 173], part[start : start + 173])
    for level, frac in enumerate((0.125, 0.25, 0.5, 1.0)):
        cols = u < frac
        expected = torch.sort(scores[:, cols], dim=1, descending=True).values[:, :T].double()
        top, n = state.level(level)
        assert n == int(cols.sum())
        torch.testing.assert_close(top, expected, rtol=0, atol=0)
    # DDP-style merge of two halves equals the whole.
    a, b = NestedTopK(Q, T), NestedTopK(Q, T)
    a.push(scores[:, : S // 2], part[: S // 2])
    b.push(scores[:, S // 2 :], part[S // 2 :])
    merged = NestedTopK.merge_ranks(torch.stack([a.top, b.top]))
    assert torch.equal(torch.sort(merged, -1).values, torch.sort(state.top, -1).values)


def test_stream_scores_from_embeddings():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(5, 8, generator=g)
    d = torch.randn(3000, 8, generator=g)
    state = NestedTopK(5, 100)
    stream_scores(q, d.numpy(), state, block_size=512)
    top, n = state.level(-1)
    assert n == 3000
    expected = torch.sort(q @ d.T, 1, descending=True).values[:, :100].double()
    torch.testing.assert_close(top, expected, rtol=1e-6, atol=1e-6)
    half, n_half = state.level(2)  # position-based nesting: first half of the stream
    assert n_half == 1500
    torch.testing.assert_close(
        half,
        torch.sort(q @ d[:1500].T, 1, descending=True).values[:, :100].double(),
        rtol=1e-6,
        atol=1e-6,
    )
    with pytest.raises(ValueError, match="scores must be"):
        state.push(torch.randn(4, 10))


def test_stream_scores_float32_under_bf16_autocast():
    g = torch.Generator().manual_seed(2)
    q = torch.nn.functional.normalize(torch.randn(5, 32, generator=g), dim=1)
    d = torch.nn.functional.normalize(torch.randn(2000, 32, generator=g), dim=1)
    state = NestedTopK(5, 100)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        stream_scores(q, d, state, block_size=512)
    top, _ = state.level(-1)
    expected = torch.sort(q.double() @ d.double().T, 1, descending=True).values[:, :100]
    torch.testing.assert_close(top, expected, rtol=0, atol=1e-6)


def test_keyed_state_keeps_each_scores_distractor_key_through_streaming_and_merging():
    g = torch.Generator().manual_seed(3)
    Q, S, T = 6, 4000, 250
    scores = torch.randn(Q, S, generator=g)  # continuous: no ties, so keys are unambiguous
    ids = torch.randperm(S, generator=g) + 10_000
    part = part_of(torch.rand(S, generator=g, dtype=torch.float64), (0.25, 0.5, 1.0))
    state = NestedTopK(Q, T, (0.25, 0.5, 1.0), keyed=True)
    for start in range(0, S, 97):  # small blocks: the sparse candidate path carries keys too
        sl = slice(start, start + 97)
        state.push(scores[:, sl], part[sl], ids[sl])
    for level in range(3):
        cols = (part <= level).nonzero().squeeze(1)
        order = torch.argsort(scores[:, cols], dim=1, descending=True)[:, :T]
        top, keys, n = state.level_with_keys(level)
        assert n == cols.numel()
        assert torch.equal(keys, ids[cols][order])
        assert torch.equal(top, torch.gather(scores[:, cols], 1, order).double())
    halves = [NestedTopK(Q, T, (0.25, 0.5, 1.0), keyed=True) for _ in range(2)]
    for h, sl in zip(halves, (slice(0, S // 2), slice(S // 2, S))):
        h.push(scores[:, sl], part[sl], ids[sl])
    top, keys = NestedTopK.merge_ranks(
        torch.stack([h.top for h in halves]), torch.stack([h.keys for h in halves])
    )
    merged = NestedTopK.from_tensors(top, state.seen, (0.25, 0.5, 1.0), keys)
    assert torch.equal(merged.level_with_keys(-1)[1], state.level_with_keys(-1)[1])


def test_keyed_state_refuses_missing_or_unexpected_keys():
    with pytest.raises(ValueError, match="needs the distractors' keys"):
        NestedTopK(2, 10, keyed=True).push(torch.randn(2, 5))
    with pytest.raises(ValueError, match="without keyed=True"):
        NestedTopK(2, 10).push(torch.randn(2, 5), -1, torch.arange(5))
    with pytest.raises(ValueError, match="integers"):
        NestedTopK(2, 10, keyed=True).push(torch.randn(2, 5), -1, torch.rand(5))
    with pytest.raises(ValueError, match="non-negative"):
        NestedTopK(2, 10, keyed=True).push(torch.randn(2, 3), -1, torch.tensor([0, -2, 1]))
    with pytest.raises(ValueError, match=r"\(5,\)"):
        NestedTopK(2, 10, keyed=True).push(torch.randn(2, 5), -1, torch.arange(4))
    with pytest.raises(ValueError, match="keys must be int64"):
        NestedTopK.from_tensors(
            torch.zeros(1, 2, 3),
            torch.zeros(1, dtype=torch.long),
            (1.0,),
            torch.zeros(1, 2, 2).long(),
        )


def test_poisson_multiplicities_are_poisson_one_and_shared_by_every_occurrence_of_a_key():
    from scipy import stats

    from rl_gap.metrics.tail.sampling import poisson_multiplicities

    keys = torch.arange(200_000)
    m = poisson_multiplicities(keys, replicate=0, seed=5)
    counts = np.bincount(m.long().numpy(), minlength=8)[:8]
    expected = stats.poisson(1.0).pmf(np.arange(8)) * keys.numel()
    assert (
        stats.chisquare(counts[:6], expected[:6] * counts[:6].sum() / expected[:6].sum()).pvalue
        > 1e-3
    )
    # The same key gets the same multiplicity wherever it sits; replicates differ; empty slots get 0.
    grid = torch.stack([keys[:1000], keys[:1000].flip(0)])
    w = poisson_multiplicities(grid, replicate=0, seed=5)
    assert torch.equal(w[0], m[:1000]) and torch.equal(w[1], m[:1000].flip(0))
    other = poisson_multiplicities(keys[:1000], replicate=1, seed=5)
    assert not torch.equal(other, m[:1000])
    assert float(np.corrcoef(other.numpy(), m[:1000].numpy())[0, 1]) < 0.1
    assert bool((poisson_multiplicities(torch.tensor([-1, -1]), 0) == 0).all())


def test_stream_scores_keys_a_keyed_state_by_row_position():
    g = torch.Generator().manual_seed(4)
    q, d = torch.randn(3, 8, generator=g), torch.randn(700, 8, generator=g)
    state = NestedTopK(3, 50, keyed=True)
    stream_scores(q, d, state, block_size=128)
    top, keys, _ = state.level_with_keys(-1)
    torch.testing.assert_close(top, torch.gather((q @ d.T).double(), 1, keys), rtol=1e-6, atol=1e-6)
