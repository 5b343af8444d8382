"""MPerClassBatchSampler: m per class in the *global* batch under DDP, epochs through Lightning,
mid-epoch resume (ResumableBatchLoader); ShardSampler coverage."""

from collections import Counter

import pytest
import torch
from lightning.fabric.utilities.data import _set_sampler_epoch
from lightning.fabric.utilities.types import _Stateful
from torch.utils.data import TensorDataset

from rl_gap.data.sampler import MPerClassBatchSampler, ResumableBatchLoader, ShardSampler


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


def _epoch_batches(labels, epoch, **kwargs):
    """Reference: a fresh sampler told the epoch directly."""
    ref = MPerClassBatchSampler(labels, **kwargs)
    ref.set_epoch(epoch)
    return list(ref)


SAMPLER = dict(batch_size=12, m_per_class=3, seed=5, batches_per_epoch=6)


def test_lightning_set_epoch_reaches_the_batch_sampler():
    # Lightning calls set_epoch on loader.sampler and loader.batch_sampler.sampler only
    labels = _labels([10] * 6)
    loader = ResumableBatchLoader(
        TensorDataset(torch.arange(len(labels))),
        batch_sampler=MPerClassBatchSampler(labels, **SAMPLER),
    )
    seen = {}
    for epoch in (0, 1, 2):
        _set_sampler_epoch(loader, epoch)
        seen[epoch] = [b[0].tolist() for b in loader]
        assert seen[epoch] == _epoch_batches(labels, epoch, **SAMPLER)
    assert seen[0] != seen[1] != seen[2]


def test_sampler_resume_skips_the_done_batches_of_that_epoch_only():
    labels = _labels([7, 9, 12, 8, 10, 6])
    full = _epoch_batches(labels, 3, **SAMPLER)
    sampler = MPerClassBatchSampler(labels, **SAMPLER)
    sampler.resume(3, 4)
    assert list(sampler) == full[4:]
    assert list(sampler) == full  # the skip applies once
    # a checkpoint from the end of epoch 3: Lightning moves on with set_epoch(4)
    sampler.resume(3, 6)
    sampler.set_epoch(4)
    assert list(sampler) == _epoch_batches(labels, 4, **SAMPLER)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_state_counts_served_batches_and_resumes_exactly(num_workers):
    labels = _labels([10] * 6)
    dataset = TensorDataset(torch.arange(len(labels)))

    def loader():
        return ResumableBatchLoader(
            dataset,
            batch_sampler=MPerClassBatchSampler(labels, **SAMPLER),
            num_workers=num_workers,
        )

    interrupted = loader()
    assert isinstance(interrupted, _Stateful)  # what Lightning checks to save the state
    _set_sampler_epoch(interrupted, 2)
    it = iter(interrupted)
    done = [next(it)[0].tolist() for _ in range(2)]
    # workers prefetch several batches; the state counts only the two served
    state = interrupted.state_dict()
    assert state == {"epoch": 2, "batches_done": 2}
    del it

    # a new process, in Lightning's order: iter() when the loader is built, the
    # checkpoint's state at on_train_start, set_epoch at the epoch start, then batches
    resumed = loader()
    it = iter(resumed)
    resumed.load_state_dict(state)
    _set_sampler_epoch(resumed, 2)
    rest = [next(it)[0].tolist() for _ in range(2)]
    assert resumed.state_dict() == {"epoch": 2, "batches_done": 4}
    rest += [b[0].tolist() for b in it]
    assert done + rest == _epoch_batches(labels, 2, **SAMPLER)
