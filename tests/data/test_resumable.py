"""The resumable shuffled batches: ranks share each global batch, a resume skips exactly, and
an item's augmentation depends only on (seed, epoch, index)."""

import random
import re

import pytest
import torch
from torch.utils.data import Dataset

from rl_gap.data.resumable import SeededItems, ShuffledBatchSampler


def test_ranks_split_each_global_batch_of_a_seeded_permutation():
    one = list(ShuffledBatchSampler(20, 6, num_replicas=1, seed=3))
    ranks = [list(ShuffledBatchSampler(20, 3, num_replicas=2, rank=r, seed=3)) for r in (0, 1)]
    g = torch.Generator().manual_seed(3 * 1_000_003 + 0)
    order = torch.randperm(20, generator=g).tolist()  # independent reference
    assert [[i for i, _ in b] for b in one] == [order[0:6], order[6:12], order[12:18]]
    for b, (r0, r1) in enumerate(zip(*ranks, strict=True)):
        assert [i for i, _ in r0] + [i for i, _ in r1] == order[6 * b : 6 * b + 6]


def test_resume_skips_the_batches_done_and_new_epochs_reshuffle():
    sampler = ShuffledBatchSampler(30, 5, seed=1)
    sampler.set_epoch(2)
    full = list(sampler)
    sampler.resume(2, 4)
    assert list(sampler) == full[4:]
    sampler.set_epoch(3)
    assert list(sampler) != full


class _Noise(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return float(torch.rand(())), random.random()


def test_seeded_items_repeat_and_leave_the_global_generators_alone():
    data = SeededItems(_Noise())
    torch.manual_seed(0)
    random.seed(0)
    expected_next = (float(torch.rand(())), random.random())
    torch.manual_seed(0)
    random.seed(0)
    a, b = data[(2, 99)], data[(2, 99)]
    c = data[(2, 100)]
    assert a == b and c[0] != a[0] and c[1] != a[1]  # both generators follow the seed
    assert (float(torch.rand(())), random.random()) == expected_next


@pytest.mark.parametrize(
    "settings, named",
    [({"batch_size": 0}, "batch_size must be >= 1, got 0"),
     ({"batch_size": 8, "batches_per_epoch": 0}, "batches_per_epoch must be >= 1 or None, got 0")],
)  # fmt: skip
def test_global_batch_modules_refuse_empty_batches_and_epochs(settings, named):
    from rl_gap.data.image_text import CLIPDataModuleBase
    from rl_gap.data.ssl import SSLDataModule

    for module in (SSLDataModule, CLIPDataModuleBase):
        with pytest.raises(ValueError, match=re.escape(named)):
            module(**settings)
    SSLDataModule(batch_size=1, batches_per_epoch=None)  # the smallest valid settings pass
    SSLDataModule(batch_size=1, batches_per_epoch=1)
