"""One meaning of ``batch_size`` (the global batch the loss ranks) and the same schedule keys
in every DataModule."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from rl_gap.data.image_text import ImageTextDataModule
from rl_gap.data.metric_learning import MNISTDemoDataModule
from rl_gap.data.resumable import ShuffledBatchSampler
from rl_gap.data.ssl_mnist import MNIST5kSSLDataModule


class _Connector:
    use_distributed_sampler = False


def _trainer(world, rank=0):
    return SimpleNamespace(world_size=world, global_rank=rank, num_devices=world, num_nodes=1,
                           _accelerator_connector=_Connector(), lightning_module=None)  # fmt: skip


@pytest.mark.parametrize("world", [1, 4])
def test_moco_batch_size_is_global(world):
    dm = MNIST5kSSLDataModule(num_train=400, batch_size=64, batches_per_epoch=3)
    dm.trainer = _trainer(world)
    dm.setup("fit")
    loader = dm.train_dataloader()
    batch = next(iter(loader))
    assert batch["views"][0].shape[0] == 64 // world  # each rank its share of 64
    assert len(loader) == 3  # batches_per_epoch accepted and applied


def test_clip_batch_size_is_global(tmp_path):
    rows = ["filepath,title"]
    for i in range(16):
        Image.fromarray(np.full((8, 8, 3), 10 * i, dtype=np.uint8)).save(tmp_path / f"{i}.png")
        rows.append(f"{i}.png,level {i}")
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    dm = ImageTextDataModule(train_table=str(tmp_path / "t.csv"), batch_size=8, num_workers=0,
                             image_size=8, batches_per_epoch=5)  # fmt: skip
    dm.trainer = _trainer(2, rank=1)
    dm.configure_for_model(lambda texts: torch.zeros(len(texts), 4, dtype=torch.long), 8,
                           (0.5,) * 3, (0.5,) * 3)  # fmt: skip
    loader = dm.train_dataloader()
    assert next(iter(loader))["image"].shape[0] == 4 and len(loader) == 5
    assert dm.eval_batch_size == 4  # per device, from the training share
    dm.trainer = _trainer(3)
    with pytest.raises(ValueError, match="global batch and must be divisible by the 3 ranks"):
        dm.train_dataloader()


def test_metric_learning_batch_was_already_global():
    dm = MNISTDemoDataModule(batch_size=100, m_per_class=20)
    dm.trainer = _trainer(4)
    dm.setup("fit")
    assert len(next(iter(dm.train_dataloader()))[0]) == 25


def test_more_batches_than_one_permutation():
    sampler = ShuffledBatchSampler(10, 4, seed=1, batches_per_epoch=5)
    batches = [[i for i, _ in b] for b in sampler]
    assert len(batches) == 5 and all(len(b) == 4 for b in batches)
    flat = [i for b in batches for i in b]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    # the first batches are those of the default epoch: resuming old runs is unchanged
    default = [[i for i, _ in b] for b in ShuffledBatchSampler(10, 4, seed=1)]
    assert batches[:2] == default
    with pytest.raises(ValueError, match="batches_per_epoch"):
        ShuffledBatchSampler(10, 4, batches_per_epoch=0)
