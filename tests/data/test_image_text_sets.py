"""Image–text sets: caption tables, pair batches, WebDataset shards, Karpathy splits."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
import torch
from PIL import Image
from torchvision.transforms.functional import to_tensor

from rl_gap.data.image_text import ImageTextDataModule
from rl_gap.data.image_text_sets import (
    CaptionTableDataset,
    PairCollate,
    karpathy_retrieval_sets,
    read_karpathy_split,
    stable_group_id,
    webdataset_pairs,
)


def solid_image(value: int, size: int = 8) -> Image.Image:
    """An RGB image whose red channel encodes ``value`` (so tests can identify it)."""
    return Image.new("RGB", (size, size), color=(value, 0, 0))


def red_value(image: torch.Tensor) -> int:
    return round(float(image[0].mean()) * 255)


def write_images(folder, names_values):
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in names_values:
        solid_image(value).save(folder / name)


# --------------------------------------------------------------- caption table
def test_caption_table_tsv_groups_rows_sharing_an_image(tmp_path):
    write_images(tmp_path / "img", [("a.png", 10), ("b.png", 20)])
    (tmp_path / "pairs.tsv").write_text(
        "filepath\ttitle\nimg/a.png\ta red square\nimg/b.png\ta darker one\n"
        "img/a.png\tthe same red square\n"
    )
    ds = CaptionTableDataset(tmp_path / "pairs.tsv", transform=to_tensor)
    assert len(ds) == 3
    items = [ds[i] for i in range(3)]
    assert [red_value(x["image"]) for x in items] == [10, 20, 10]
    assert [x["text"] for x in items] == ["a red square", "a darker one", "the same red square"]
    assert items[0]["group"] == items[2]["group"] != items[1]["group"]


def test_held_out_caption_table_as_retrieval_sets(tmp_path):
    """Each distinct image once in order of first appearance; a caption's group is its image."""
    write_images(tmp_path / "img", [("a.png", 10), ("b.png", 20), ("c.png", 30)])
    (tmp_path / "held.csv").write_text(
        "filepath,title\nimg/b.png,b one\nimg/a.png,a one\nimg/b.png,b two\nimg/c.png,c one\n"
    )
    dm = ImageTextDataModule(retrieval=[{"table": str(tmp_path / "held.csv")}], num_workers=0)
    images, texts = dm.eval_datasets()
    assert images.eval_name == texts.eval_name == "held"
    assert images.images == [str(tmp_path / "img" / f"{c}.png") for c in "bac"]
    assert images[0]["image"].shape == (3, 224, 224)  # the model's eval transform
    assert [(it["group"], it["index"]) for it in images] == [(0, 0), (1, 1), (2, 2)]
    assert [(it["text"], it["group"]) for it in texts] == [
        ("b one", 0), ("a one", 1), ("b two", 0), ("c one", 2),
    ]  # fmt: skip


def test_caption_table_csv_custom_columns_and_errors(tmp_path):
    write_images(tmp_path, [("x.png", 5)])
    (tmp_path / "pairs.csv").write_text('image,caption\nx.png,"a, comma"\n')
    ds = CaptionTableDataset(
        tmp_path / "pairs.csv", image_key="image", caption_key="caption", transform=to_tensor
    )
    assert ds[0]["text"] == "a, comma"
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['filepath', 'title'\]"):
        CaptionTableDataset(tmp_path / "pairs.csv")
    with pytest.raises(FileNotFoundError, match="caption table not found"):
        CaptionTableDataset(tmp_path / "missing.csv")
    (tmp_path / "empty.csv").write_text("filepath,title\n")
    with pytest.raises(ValueError, match="no data rows"):
        CaptionTableDataset(tmp_path / "empty.csv")
    (tmp_path / "bad.csv").write_text("filepath,title\nnope.png,missing image\n")
    with pytest.raises(FileNotFoundError, match="image file not found"):
        CaptionTableDataset(tmp_path / "bad.csv", transform=to_tensor)[0]


def test_pair_collate_tokenizes_or_keeps_strings():
    samples = [
        {"image": torch.zeros(3, 2, 2), "text": "a", "group": 4},
        {"image": torch.ones(3, 2, 2), "text": "b", "group": 5},
    ]
    raw = PairCollate()(samples)
    assert raw["text"] == ["a", "b"] and raw["group"].tolist() == [4, 5]
    assert raw["image"].shape == (2, 3, 2, 2)
    tokenized = PairCollate(lambda texts: torch.tensor([[len(t)] for t in texts]))(samples)
    assert tokenized["text"].tolist() == [[1], [1]]


# ------------------------------------------------------------------ WebDataset
def write_shard(path, samples):
    with tarfile.open(path, "w") as tar:
        for key, value, caption in samples:
            buf = io.BytesIO()
            solid_image(value).save(buf, format="PNG")
            for ext, data in (("png", buf.getvalue()), ("txt", caption.encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_webdataset_shards_yield_matching_pairs(tmp_path):
    samples = [(f"s{i:03d}", 10 * i, f"caption {i}") for i in range(10)]
    write_shard(tmp_path / "shard-0.tar", samples[:5])
    write_shard(tmp_path / "shard-1.tar", samples[5:])
    ds = webdataset_pairs(
        str(tmp_path / "shard-{0..1}.tar"),
        to_tensor,
        num_samples=10,
        batch_size=4,
        shuffle_buffer=0,
    )
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=PairCollate())
    batches = list(loader)
    # ceil(10 / 4) = 3 full batches per epoch (the shards are cycled).
    assert [len(b["text"]) for b in batches] == [4, 4, 4]
    seen = {}
    for b in batches:
        for image, caption, group in zip(b["image"], b["text"], b["group"].tolist()):
            i = int(caption.split()[1])
            assert red_value(image) == 10 * i  # image and caption of one sample
            assert group == stable_group_id(f"s{i:03d}")
            seen[i] = group
    assert len(set(seen.values())) == len(seen)  # distinct samples, distinct groups


def test_webdataset_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="shard"):
        webdataset_pairs(str(tmp_path / "x-{0..1}.tar"), to_tensor, 10, 2)
    write_shard(tmp_path / "only.tar", [("k", 1, "c")])
    with pytest.raises(ValueError, match="cannot feed 2 rank"):
        webdataset_pairs(str(tmp_path / "only.tar"), to_tensor, 10, 2, world_size=2)
    with pytest.raises(ValueError, match="train_num_samples"):
        ImageTextDataModule(train_shards=str(tmp_path / "only.tar"))


# --------------------------------------------------------------------- Karpathy
def write_karpathy(tmp_path):
    images = []
    for i, (split, value) in enumerate([("test", 10), ("train", 20), ("test", 30)]):
        images.append(
            {
                "filename": f"im{i}.png",
                "filepath": "val2014",
                "split": split,
                "sentences": [{"raw": f"image {i} caption {c} "} for c in range(5)],
            }
        )
        write_images(tmp_path / "val2014", [(f"im{i}.png", value)])
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"dataset": "coco", "images": images}))
    return path


def test_karpathy_split_reads_images_and_caption_groups(tmp_path):
    path = write_karpathy(tmp_path)
    images, captions, owners = read_karpathy_split(path, tmp_path, "test")
    assert images == [str(tmp_path / "val2014/im0.png"), str(tmp_path / "val2014/im2.png")]
    assert len(captions) == 10 and captions[0] == "image 0 caption 0"
    assert owners == [0] * 5 + [1] * 5
    image_set, text_set = karpathy_retrieval_sets(path, tmp_path, "test", to_tensor, "coco")
    assert (image_set.eval_role, text_set.eval_role) == ("retrieval_images", "retrieval_texts")
    assert red_value(image_set[1]["image"]) == 30 and image_set[1]["group"] == 1
    assert text_set[7] == {"text": "image 2 caption 2", "group": 1, "index": 7}
    with pytest.raises(ValueError, match="no image in split"):
        read_karpathy_split(path, tmp_path, "restval")
    with pytest.raises(FileNotFoundError, match="Karpathy"):
        read_karpathy_split(tmp_path / "nope.json", tmp_path, "test")
