"""SSL data: MoCo v3 two-crop views, folder-per-class DataModule, MNIST-5k demo split."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from rl_gap.data.ssl import blur_kernel_size, moco_v3_augmentations
from rl_gap.data.ssl_imagefolder import ImageFolderSSLDataModule, check_image_folder
from rl_gap.data.ssl_mnist import MNIST5kSSLDataModule


def _steps(pipeline):
    """(transform type, probability) of each step, unwrapping RandomApply."""
    out = []
    for t in pipeline.transforms:
        if isinstance(t, T.RandomApply):
            out += [(type(inner).__name__, t.p) for inner in t.transforms]
        else:
            out.append((type(t).__name__, getattr(t, "p", None)))
    return out


def test_moco_v3_view_pipelines_follow_the_recipe():
    view1, view2 = moco_v3_augmentations(224, crop_min=0.08)
    steps1, steps2 = dict(_steps(view1)), dict(_steps(view2))
    assert steps1["ColorJitter"] == steps2["ColorJitter"] == 0.8
    assert steps1["RandomGrayscale"] == steps2["RandomGrayscale"] == 0.2
    assert steps1["GaussianBlur"] == 1.0 and steps2["GaussianBlur"] == 0.1
    assert "RandomSolarize" not in steps1 and steps2["RandomSolarize"] == 0.2
    assert steps1["RandomHorizontalFlip"] == 0.5
    crop = view1.transforms[0]
    assert crop.size == (224, 224) and crop.scale == (0.08, 1.0)
    jitter = view1.transforms[1].transforms[0]
    assert (jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue) == (
        (0.6, 1.4), (0.6, 1.4), (0.8, 1.2), (-0.1, 0.1),
    )  # fmt: skip
    assert blur_kernel_size(224) == 23 and blur_kernel_size(28) == 3
    blur = view1.transforms[3].transforms[0]
    assert blur.sigma == pytest.approx((0.1, 2.0))
    small_blur = moco_v3_augmentations(28)[0].transforms[3].transforms[0]
    assert small_blur.sigma == pytest.approx((0.0125, 0.25))
    with pytest.raises(ValueError, match="crop_min"):
        moco_v3_augmentations(32, crop_min=0.0)


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
