"""Metric-learning data: on-disk layouts (SOP, iNaturalist, CUB, folder/CSV), errors, MNIST demo."""

import numpy as np
import pytest
import torch
from PIL import Image

from rl_gap.data.metric_learning import (
    CUBDataModule,
    ImageFolderDataModule,
    INaturalistDataModule,
    MNISTDemoDataModule,
    SOPDataModule,
)
from rl_gap.data.ml_layouts import read_cub, read_folder_or_csv, read_inat, read_sop


def _image(path, value=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((12, 10, 3), value, dtype=np.uint8)).save(path)


def _make_sop(root):
    for split, classes in (("train", (1, 2, 3)), ("test", (4, 5))):
        rows = ["image_id class_id super_class_id path"]
        for c in classes:
            for k in range(4):
                rel = f"bicycle_final/{c}_{k}.JPG"
                _image(root / rel, 10 * c + k)
                rows.append(f"{len(rows)} {c} 1 {rel}")
        (root / f"Ebay_{split}.txt").write_text("\n".join(rows) + "\n")


def test_sop_layout_and_datamodule(tmp_path):
    _make_sop(tmp_path)
    train, test = read_sop(tmp_path, "train"), read_sop(tmp_path, "test")
    assert len(train) == 12 and len(test) == 8
    assert set(train.labels) == {1, 2, 3} and set(test.labels) == {4, 5}
    dm = SOPDataModule(str(tmp_path), batch_size=4, m_per_class=2, num_workers=0, image_size=8)
    dm.setup("fit")
    x, y, i = dm.datasets["train"][5]
    assert x.shape == (3, 8, 8) and y == 2 and i == 5
    images, labels, indices = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 8, 8)
    assert sorted(torch.bincount(labels).tolist())[-2:] == [2, 2]
    batch = next(iter(dm.val_dataloader()))
    assert set(batch[1].tolist()) <= {4, 5}


def test_inat_list_labels_from_folders(tmp_path):
    lines = []
    for c in (101, 202):
        for k in range(3):
            rel = f"train_val2018/Plantae/{c}/img{k}.jpg"
            _image(tmp_path / rel)
            lines.append(rel)
    (tmp_path / "Inaturalist_train_set1.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "Inaturalist_test_set1.txt").write_text(lines[0] + " 7\n")
    train = read_inat(tmp_path, "train")
    assert train.labels == [101] * 3 + [202] * 3
    assert train.paths[0] == tmp_path / lines[0]
    assert read_inat(tmp_path, "test").labels == [7]
    dm = INaturalistDataModule(str(tmp_path), num_workers=0, image_size=8)
    dm.setup("test")
    assert len(dm.datasets["test"]) == 1


def test_cub_is_split_by_class(tmp_path):
    images, labels = [], []
    for n, c in enumerate((1, 100, 101, 200), start=1):
        rel = f"{c:03d}.Bird/x{n}.jpg"
        _image(tmp_path / "images" / rel)
        images.append(f"{n} {rel}")
        labels.append(f"{n} {c}")
    (tmp_path / "images.txt").write_text("\n".join(images))
    (tmp_path / "image_class_labels.txt").write_text("\n".join(labels))
    assert read_cub(tmp_path, "train").labels == [1, 100]
    assert read_cub(tmp_path, "test").labels == [101, 200]
    assert CUBDataModule(str(tmp_path)).build_split("test", train=False).labels.tolist() == [
        101,
        200,
    ]


def test_folder_and_csv(tmp_path):
    for name in ("cat", "dog"):
        for k in range(2):
            _image(tmp_path / "train" / name / f"{k}.png")
    folder = read_folder_or_csv(tmp_path / "train")
    assert folder.labels == [0, 0, 1, 1]
    (tmp_path / "test.csv").write_text("path,label\ntrain/cat/0.png,5\ntrain/dog/1.png,9\n")
    csv = read_folder_or_csv(tmp_path / "test.csv")
    assert csv.labels == [5, 9] and csv.paths[1] == tmp_path / "train/dog/1.png"
    dm = ImageFolderDataModule(str(tmp_path / "train"), str(tmp_path / "test.csv"), num_workers=0)
    dm.setup("test")
    assert dm.datasets["test"].labels.tolist() == [5, 9]


def test_missing_root_and_bad_csv(tmp_path):
    with pytest.raises(FileNotFoundError, match="SOP root directory not found.*nowhere"):
        read_sop(tmp_path / "nowhere", "train")
    with pytest.raises(FileNotFoundError, match="image folder"):
        read_folder_or_csv(tmp_path / "missing")
    (tmp_path / "bad.csv").write_text("file,class\na.png,1\n")
    with pytest.raises(ValueError, match="'path' and 'label'"):
        read_folder_or_csv(tmp_path / "bad.csv")
    dm = SOPDataModule(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="Ebay_test.txt|nowhere"):
        dm.setup("test")


def test_missing_image_file_is_named(tmp_path):
    _make_sop(tmp_path)
    (tmp_path / "bicycle_final/1_0.JPG").unlink()
    dm = SOPDataModule(str(tmp_path), num_workers=0, image_size=8)
    with pytest.raises(FileNotFoundError, match="1_0.JPG"):
        dm.setup("fit")  # found at setup (check_files), not mid-epoch


def test_mnist_demo_is_class_disjoint_and_real():
    dm = MNISTDemoDataModule()
    dm.setup("fit")
    train, test = dm.datasets["train"], dm.datasets["test"]
    assert len(train) == 2500 and len(test) == 2500
    assert set(train.labels.tolist()) == {0, 1, 2, 3, 4}
    assert set(test.labels.tolist()) == {5, 6, 7, 8, 9}
    x, _, _ = train[0]
    assert x.shape == (1, 28, 28)
    # normalised real digits: zero-ish mean, unit-ish std over the split
    assert abs(float(train.images.mean())) < 0.2 and 0.8 < float(train.images.std()) < 1.2
    with pytest.raises(ValueError, match="disjoint"):
        MNISTDemoDataModule(train_digits=(0, 1), test_digits=(1, 2))


def test_val_split_holds_out_whole_classes():
    dm = MNISTDemoDataModule(val_split=0.4, batch_size=60, m_per_class=20)
    dm.setup("fit")
    train_classes = set(dm.datasets["train"].labels.tolist())
    val_classes = set(dm.datasets["val"].labels.tolist())
    assert len(val_classes) == 2 and len(train_classes) == 3
    assert not train_classes & val_classes and train_classes | val_classes == {0, 1, 2, 3, 4}
    x, y, i = dm.datasets["val"][3]
    assert i == 3 and y == int(dm.datasets["val"].labels[3])
