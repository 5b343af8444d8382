"""Bad data: corrupt WebDataset members, truncated images, class-folder names, CSV indexes."""

from __future__ import annotations

import io
import logging
import tarfile

import pytest
import torch
from PIL import Image
from torchvision.transforms.functional import to_tensor

from rl_gap.data.image_text import PairCollate, load_image, stable_group_id, webdataset_pairs
from rl_gap.data.metric_learning import ImageFolderDataModule
from rl_gap.data.ml_datasets import ImageListDataset
from rl_gap.data.ml_layouts import ImageList, read_folder_or_csv


def png_bytes(value: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), color=(value, 0, 0)).save(buf, format="PNG")
    return buf.getvalue()


def truncated_jpeg(path) -> None:
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), color=(200, 10, 10)).save(buf, format="JPEG")
    path.write_bytes(buf.getvalue()[:300])  # header intact, pixel data cut


def test_webdataset_logs_and_skips_a_corrupt_image(tmp_path, caplog):
    good = [(f"s{i:02d}", png_bytes(10 * i), f"caption {i}") for i in range(6)]
    bad = ("s99", png_bytes(99)[:40], "caption 99")  # a truncated PNG member
    with tarfile.open(tmp_path / "shard-0.tar", "w") as tar:
        for key, data, caption in [*good[:3], bad, *good[3:]]:
            for ext, blob in (("png", data), ("txt", caption.encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    ds = webdataset_pairs(
        str(tmp_path / "shard-0.tar"), to_tensor, num_samples=6, batch_size=6, shuffle_buffer=0
    )
    with caplog.at_level(logging.WARNING, logger="rl_gap.data.image_text_sets"):
        (batch,) = list(torch.utils.data.DataLoader(ds, batch_size=6, collate_fn=PairCollate()))
    assert batch["text"] == [f"caption {i}" for i in range(6)]  # the bad one skipped
    assert batch["group"].tolist() == [stable_group_id(f"s{i:02d}") for i in range(6)]
    assert [round(float(x[0].mean()) * 255) for x in batch["image"]] == [10 * i for i in range(6)]
    (record,) = [r for r in caplog.records if "skipping" in r.getMessage()]
    assert "s99" in record.getMessage() and "shard-0.tar" in record.getMessage()


def test_truncated_image_errors_name_the_file(tmp_path):
    path = tmp_path / "cut.jpg"
    truncated_jpeg(path)
    with pytest.raises(OSError, match=r"cannot read image .*cut\.jpg"):
        load_image(path, to_tensor)
    ds = ImageListDataset(ImageList([path], [3]), to_tensor)
    with pytest.raises(OSError, match=r"cannot read image .*cut\.jpg"):
        ds[0]


def test_truncated_image_in_an_ssl_image_folder_names_the_file(tmp_path):
    from rl_gap.data.ssl_imagefolder import ImageFolderSSLDataModule

    for split in ("train", "val"):
        (tmp_path / split / "cat").mkdir(parents=True)
        truncated_jpeg(tmp_path / split / "cat" / "cut.jpg")
    data = ImageFolderSSLDataModule(str(tmp_path / "train"), str(tmp_path / "val"), image_size=16)
    data.setup("fit")
    with pytest.raises(OSError, match=r"cannot read image .*train/cat/cut\.jpg"):
        data.train_set[0]


def test_class_folders_1_and_01_stay_two_classes(tmp_path):
    for name, value in (("1", 10), ("01", 20), ("2", 30)):
        (tmp_path / name).mkdir()
        Image.new("RGB", (4, 4), color=(value, 0, 0)).save(tmp_path / name / "a.png")
    items = read_folder_or_csv(tmp_path)
    by_folder = {p.parent.name: label for p, label in zip(items.paths, items.labels, strict=True)}
    assert len(set(by_folder.values())) == 3
    # plain integer names keep their numbers
    for name in ("01",):
        for f in (tmp_path / name).iterdir():
            f.unlink()
        (tmp_path / name).rmdir()
    items = read_folder_or_csv(tmp_path)
    assert sorted(items.labels) == [1, 2]


def test_label_csv_header_variants_and_headerless_error(tmp_path):
    for i in range(2):
        Image.new("RGB", (4, 4)).save(tmp_path / f"{i}.png")
    (tmp_path / "index.csv").write_text("\ufeffPath , Label\n0.png,7\n1.png, 8\n\n")
    items = read_folder_or_csv(tmp_path / "index.csv")
    assert items.paths == [tmp_path / "0.png", tmp_path / "1.png"] and items.labels == [7, 8]
    (tmp_path / "noheader.csv").write_text("0.png,7\n1.png,8\n")
    with pytest.raises(
        ValueError, match="first row must be a header naming the 'path' and 'label'"
    ):
        read_folder_or_csv(tmp_path / "noheader.csv")


def test_missing_images_in_a_csv_are_found_at_setup(tmp_path):
    (tmp_path / "train").mkdir()
    for i in range(4):
        Image.new("RGB", (4, 4)).save(tmp_path / "train" / f"{i}.png")
    rows = "".join(f"train/{i}.png,{i % 2}\n" for i in range(4))
    (tmp_path / "train.csv").write_text("path,label\n" + rows + "train/gone.png,1\n")
    (tmp_path / "test.csv").write_text("path,label\n" + rows)
    kwargs = dict(train=str(tmp_path / "train.csv"), test=str(tmp_path / "test.csv"),
                  batch_size=4, m_per_class=2, num_workers=0, image_size=8)  # fmt: skip
    data = ImageFolderDataModule(**kwargs)
    with pytest.raises(FileNotFoundError, match=r"1 of 5 images .* missing.*gone\.png"):
        data.setup("fit")
    # check_files=False: no pass at setup (huge sets); the missing file fails when read
    data = ImageFolderDataModule(**kwargs, check_files=False)
    data.setup("fit")
    with pytest.raises(FileNotFoundError, match="gone.png"):
        data.datasets["train"][4]
