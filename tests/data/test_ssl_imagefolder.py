"""Folder-per-class SSL data: two-view batches, the kNN bank and queries, layout errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from rl_gap.data.ssl_imagefolder import ImageFolderSSLDataModule, check_image_folder


def _write_folder(root, classes, per_class, size=40, seed=0):
    rng = np.random.default_rng(seed)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / c / f"{i}.png")


def test_image_folder_datamodule_batches(tmp_path):
    _write_folder(tmp_path / "train", ["cat", "dog", "emu"], 4)
    _write_folder(tmp_path / "val", ["cat", "emu"], 2, seed=1)
    dm = ImageFolderSSLDataModule(
        str(tmp_path / "train"), str(tmp_path / "val"), image_size=32, batch_size=4,
        num_workers=0, pin_memory=False, knn_bank_size=6,
    )  # fmt: skip
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    x1, x2 = batch["views"]
    assert x1.shape == x2.shape == (4, 3, 32, 32) and x1.dtype == torch.float32
    assert not torch.equal(x1, x2)  # independent augmentations
    assert len(dm.train_dataloader()) == 3  # 12 images, drop_last
    bank, queries = dm.val_dataloader()
    assert len(bank.dataset) == 6
    labels = torch.cat([b["label"] for b in queries])
    # val's {cat, emu} keep the training indices {0, 2}, not ImageFolder's {0, 1}.
    assert sorted(labels.tolist()) == [0, 0, 2, 2]
    assert next(iter(queries))["image"].shape == (4, 3, 32, 32)


def test_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*class_name"):
        check_image_folder(tmp_path / "missing")
    (tmp_path / "flat").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "flat" / "a.png")
    with pytest.raises(FileNotFoundError, match="no class sub-folder"):
        check_image_folder(tmp_path / "flat")
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no image file"):
        check_image_folder(tmp_path / "empty")
    _write_folder(tmp_path / "tr", ["a"], 2, size=8)
    _write_folder(tmp_path / "va", ["b"], 2, size=8)
    dm = ImageFolderSSLDataModule(str(tmp_path / "tr"), str(tmp_path / "va"), num_workers=0)
    with pytest.raises(ValueError, match="not in the training folders"):
        dm.setup("fit")
