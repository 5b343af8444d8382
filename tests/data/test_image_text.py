"""Image–text data: caption tables, WebDataset shards, Karpathy splits, zero-shot folders."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms.functional import to_tensor

from rl_gap.data.image_text import (
    CaptionTableDataset,
    ImageTextDataModule,
    PairCollate,
    karpathy_retrieval_sets,
    read_karpathy_split,
    stable_group_id,
    webdataset_pairs,
)
from rl_gap.data.zero_shot import FolderClassification, resolve_classnames, template_set


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


# ------------------------------------------------------------------- zero-shot
def test_folder_classification_names_and_templates(tmp_path):
    write_images(tmp_path / "zs" / "golden_retriever", [("1.png", 1), ("2.jpg", 2)])
    write_images(tmp_path / "zs" / "cat", [("1.png", 3)])
    ds = FolderClassification(tmp_path / "zs", to_tensor, templates=["a photo of a {}."])
    assert ds.classnames == ["cat", "golden retriever"]
    assert [ds[i]["label"] for i in range(3)] == [0, 1, 1]
    assert red_value(ds[0]["image"]) == 3
    named = FolderClassification(tmp_path / "zs", to_tensor, classnames=["kitty", "dog"])
    assert named.classnames == ["kitty", "dog"] and len(named.templates) == 80
    (tmp_path / "names.json").write_text(json.dumps({"cat": "tabby", "golden_retriever": "dog"}))
    assert resolve_classnames(["cat", "golden_retriever"], str(tmp_path / "names.json")) == [
        "tabby",
        "dog",
    ]
    assert len(resolve_classnames([f"n{i}" for i in range(1000)], "imagenet")) == 1000
    with pytest.raises(ValueError, match="2 class folders"):
        resolve_classnames(["a", "b"], ["only one"])
    with pytest.raises(ValueError, match="unknown template set"):
        template_set("fancy")
    with pytest.raises(FileNotFoundError, match="root/<class>/<image>"):
        FolderClassification(tmp_path / "missing")


# --------------------------------------------------------- DataModule + module
def test_datamodule_fast_dev_run_with_csv_karpathy_and_zero_shot(tmp_path):
    """fit(fast_dev_run) through the real loaders: training pairs, retrieval, zero-shot."""
    import lightning as L

    from rl_gap.models.clip import tiny_clip_config
    from rl_gap.modules.clip_finetune import CLIPFineTuneModule

    rows = ["filepath,title"]
    for i in range(8):
        Image.fromarray(np.full((40, 40, 3), 30 * i, dtype=np.uint8)).save(tmp_path / f"{i}.png")
        rows.append(f"{i}.png,gray level {i}")
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    karpathy = write_karpathy(tmp_path)
    write_images(tmp_path / "zs" / "red", [("1.png", 200)])
    write_images(tmp_path / "zs" / "black", [("1.png", 0)])
    dm = ImageTextDataModule(
        train_table=str(tmp_path / "train.csv"),
        retrieval=[{"name": "coco", "annotations": str(karpathy), "image_root": str(tmp_path)}],
        zero_shot=[{"name": "colors", "root": str(tmp_path / "zs"), "templates": ["a {} image"]}],
        batch_size=4,
        num_workers=0,
    )
    torch.manual_seed(0)
    module = CLIPFineTuneModule(
        model_name=None, model_config=tiny_clip_config(width=32, context_length=16)
    )
    trainer = L.Trainer(
        accelerator="cpu",
        fast_dev_run=True,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=dm)
    assert dm.image_size == 32 and dm.tokenizer is module.clip.tokenizer
    logged = trainer.callback_metrics
    for key in ("coco/i2t_gap", "coco/t2i_map", "coco/i2t_r@1", "colors/zs_top1"):
        assert f"val/{key}" in logged, sorted(logged)
    assert torch.isfinite(logged["train/loss"])
    too_big = ImageTextDataModule(train_table=str(tmp_path / "train.csv"), batch_size=64)
    too_big.configure_for_model(module.clip.tokenizer, 32, module.clip.mean, module.clip.std)
    with pytest.raises(ValueError, match="fewer than batch_size"):
        too_big.train_dataloader()
