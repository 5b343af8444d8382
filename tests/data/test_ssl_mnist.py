"""The MNIST-5k SSL demo: its split, two views per image, deterministic evaluation images."""

from __future__ import annotations

import pytest
import torch

from rl_gap.data.ssl_mnist import MNIST5kSSLDataModule


def test_mnist_demo_split_and_views():
    dm = MNIST5kSSLDataModule(num_train=4500, batch_size=16, eval_batch_size=100)
    dm.setup("fit")
    assert len(dm.train_set) == 4500 and len(dm.query_set) == 500
    batch = next(iter(dm.train_dataloader()))
    assert [v.shape for v in batch["views"]] == [(16, 1, 28, 28)] * 2
    bank, queries = dm.val_dataloader()
    first = next(iter(queries))
    assert first["image"].shape == (100, 1, 28, 28)
    # The evaluation transform is deterministic: same image twice, same tensor.
    a, b = dm.query_set[0]["image"], dm.query_set[0]["image"]
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="num_train"):
        MNIST5kSSLDataModule(num_train=5000)
