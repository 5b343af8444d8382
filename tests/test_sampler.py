"""MPerClassBatchSampler: m per class in the *global* batch under DDP; ShardSampler coverage."""

from collections import Counter

import pytest
import torch

from rl_gap.data.sampler import MPerClassBatchSampler, ShardSampler


def _labels(sizes):
    return torch.cat([torch.full((n,), c) for c, n in enumerate(sizes)])


def _check_global_batch(batch, labels, classes_per_batch, m, distinct=True):
    counts = Counter(labels[batch].tolist())
    assert len(counts) == classes_per_batch
    assert set(counts.values()) == {m}
    if distinct:
        assert len(set(batch)) == len(batch)


def test_single_process_batches_have_m_per_class():
    labels = _labels([7, 9, 12, 8, 10, 6])
    sampler = MPerClassBatchSampler(labels, batch_size=12, m_per_class=4, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler) == len(labels) // 12
    for b in batches:
        _check_global_batch(b, labels, 3, 4)


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_ranks_partition_the_global_batch(world):
    labels = _labels([5, 8, 13, 6, 9, 11, 7, 4])
    kwargs = dict(batch_size=16, m_per_class=4, seed=1)
    reference = MPerClassBatchSampler(labels, num_replicas=1, rank=0, **kwargs)
    ranks = [
        MPerClassBatchSampler(labels, num_replicas=world, rank=r, **kwargs) for r in range(world)
    ]
    for epoch in (0, 1):
        for s in [reference, *ranks]:
            s.set_epoch(epoch)
        per_rank = [list(s) for s in ranks]
        # every rank steps the same number of batches (else DDP hangs)
        assert {len(b) for b in per_rank} == {len(reference)}
        for step, single in enumerate(reference):
            local = [per_rank[r][step] for r in range(world)]
            assert all(len(x) == 16 // world for x in local)
            merged = [i for x in local for i in x]
            # ranks draw distinct samples and their union is the single-process batch
            assert merged == single
            _check_global_batch(merged, labels, 4, 4)


def test_epochs_differ_and_are_reproducible():
    labels = _labels([10] * 6)
    a = MPerClassBatchSampler(labels, batch_size=12, m_per_class=3, seed=0)
    b = MPerClassBatchSampler(labels, batch_size=12, m_per_class=3, seed=0)
    first = list(a)
    assert first == list(b)
    a.set_epoch(1)
    assert list(a) != first


def test_small_classes_are_filled_with_repeats():
    labels = _labels([2, 2, 2, 9])
    sampler = MPerClassBatchSampler(labels, batch_size=8, m_per_class=4, seed=0)
    for batch in sampler:
        _check_global_batch(batch, labels, 2, 4, distinct=False)
        for c in Counter(labels[batch].tolist()):
            members = set(batch) & set(torch.nonzero(labels == c).flatten().tolist())
            assert len(members) == min(4, int((labels == c).sum()))


def test_every_image_is_drawn_about_equally_often():
    # classes per batch << classes (the SOP/iNat regime): size-proportional class draws
    sizes = [10 + 5 * (c % 5) for c in range(20)]
    labels = _labels(sizes)
    steps = 8000
    sampler = MPerClassBatchSampler(labels, batch_size=10, m_per_class=5, batches_per_epoch=steps)
    counts = torch.bincount(torch.tensor([i for b in sampler for i in b]), minlength=len(labels))
    per_class = torch.stack([counts[labels == c].double().mean() for c in range(20)])
    expected = steps * 10 / len(labels)  # ~800 draws per class: ~3.5% noise
    assert per_class.min() > 0.88 * expected and per_class.max() < 1.12 * expected


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch_size=10, m_per_class=4), "multiple of m_per_class"),
        (dict(batch_size=32, m_per_class=4), "needs 8 classes"),
        (dict(batch_size=12, m_per_class=4, num_replicas=5, rank=0), "not divisible"),
        (dict(batch_size=12, m_per_class=4, num_replicas=2, rank=2), "invalid rank"),
    ],
)
def test_bad_settings_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MPerClassBatchSampler(_labels([5, 5, 5, 5]), **kwargs)


def test_float_labels_rejected():
    with pytest.raises(ValueError, match="integers"):
        MPerClassBatchSampler(torch.rand(10), batch_size=4, m_per_class=2)


def test_shard_sampler_covers_each_item_once():
    shards = [list(ShardSampler(11, 3, r)) for r in range(3)]
    assert sorted(i for s in shards for i in s) == list(range(11))
    assert [len(ShardSampler(11, 3, r)) for r in range(3)] == [4, 4, 3]
