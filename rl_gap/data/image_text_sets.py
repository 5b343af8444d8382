"""Image–text datasets and readers: caption tables, WebDataset shards, Karpathy splits.

The DataModules that assemble them live in ``rl_gap.data.image_text`` (which
re-exports everything here); see its docstring for the batch protocol.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from rl_gap.data.ml_layouts import open_rgb

ImageItem = str | os.PathLike | Image.Image | torch.Tensor
Transform = Callable[[Any], torch.Tensor]

RETRIEVAL_IMAGES = "retrieval_images"
RETRIEVAL_TEXTS = "retrieval_texts"
ZERO_SHOT = "zero_shot"


def load_image(item: ImageItem, transform: Transform | None) -> torch.Tensor:
    """A path / PIL image / tensor -> transformed (3, H, W) float tensor."""
    if isinstance(item, str | os.PathLike):
        path = Path(item)
        if not path.is_file():
            raise FileNotFoundError(f"image file not found: {path}")
        item = open_rgb(path)  # a corrupt/truncated file: OSError naming the path
    out = transform(item) if transform is not None else item
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"the image transform must return a tensor, got {type(out).__name__}")
    return out


def decode_image_bytes(data: bytes, where: str) -> Image.Image:
    """Encoded image bytes (a WebDataset member) -> RGB image; errors name ``where``."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.convert("RGB")
    except (OSError, SyntaxError, ValueError) as error:
        raise ValueError(f"corrupt or truncated image {where}: {error}") from error


def stable_group_id(key: str) -> int:
    """A deterministic non-negative int63 id for a string key (same on every rank)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class PairCollate:
    """Stack samples into a batch dict; tokenize captions when a tokenizer is set.

    Picklable (DataLoader workers). ``tokenizer`` maps ``list[str]`` to an
    int64 (B, L) tensor; without one, ``"text"`` stays a list of strings and
    the module tokenizes.
    """

    def __init__(self, tokenizer: Callable[[list[str]], torch.Tensor] | None = None) -> None:
        self.tokenizer = tokenizer

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        if not samples:
            raise ValueError("empty batch")
        batch: dict[str, Any] = {}
        for key in samples[0]:
            values = [s[key] for s in samples]
            if key == "image":
                batch[key] = torch.stack(values)
            elif key == "text":
                batch[key] = self.tokenizer(values) if self.tokenizer is not None else values
            else:
                batch[key] = torch.as_tensor(values, dtype=torch.long)
        return batch


# ----------------------------------------------------------------- training
def read_caption_table(
    path: str | os.PathLike,
    image_key: str = "filepath",
    caption_key: str = "title",
    separator: str | None = None,
) -> tuple[list[str], list[str]]:
    """Read (image path, caption) columns of a CSV/TSV with a header row.

    ``separator`` defaults to a tab for ``.tsv`` files and a comma otherwise.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"caption table not found: {path} (expected a CSV/TSV with header columns "
            f"{image_key!r} and {caption_key!r})"
        )
    if separator is None:
        separator = "\t" if path.suffix.lower() == ".tsv" else ","
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter=separator)
        fields = reader.fieldnames or []
        missing = [k for k in (image_key, caption_key) if k not in fields]
        if missing:
            raise ValueError(
                f"{path} lacks column(s) {missing} (separator {separator!r}); header: {fields}"
            )
        rows = [(row[image_key], row[caption_key]) for row in reader]
    if not rows:
        raise ValueError(f"{path} has no data rows")
    images, captions = zip(*rows)
    return list(images), list(captions)


class CaptionTableDataset(Dataset):
    """Image–caption pairs from a CSV/TSV (open_clip's ``CsvDataset`` layout).

    Rows sharing an image path form one caption group (relevant to each
    other's images); with one caption per image the relevance is the identity.

    Args:
        path: the CSV/TSV file.
        image_root: directory relative image paths are resolved against
            (default: the table's directory).
        image_key, caption_key, separator: see ``read_caption_table``.
        transform: PIL image -> (3, H, W) tensor.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        image_root: str | os.PathLike | None = None,
        image_key: str = "filepath",
        caption_key: str = "title",
        separator: str | None = None,
        transform: Transform | None = None,
    ) -> None:
        images, self.captions = read_caption_table(path, image_key, caption_key, separator)
        root = Path(image_root) if image_root is not None else Path(path).parent
        self.images = [str(root / p) for p in images]
        _, groups = np.unique(np.asarray(self.images), return_inverse=True)
        self.groups = groups.astype(np.int64)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.captions)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "image": load_image(self.images[i], self.transform),
            "text": self.captions[i],
            "group": int(self.groups[i]),
        }

    def retrieval_sets(self, name: str = "retrieval") -> tuple[RetrievalImages, RetrievalTexts]:
        """The table as an (images, captions) evaluation pair (a held-out table in the training
        table's layout): each distinct image once, in order of first appearance, every row a
        caption relevant to its image."""
        index: dict[str, int] = {}
        owners = [index.setdefault(path, len(index)) for path in self.images]
        return retrieval_pair(list(index), self.captions, owners, self.transform, name)


def _shard_list(shards: str | Sequence[str]) -> list[str]:
    """Expand a brace pattern (``cc12m-{00000..01242}.tar``) or a list of paths."""
    import braceexpand

    patterns = [shards] if isinstance(shards, str) else list(shards)
    urls = [u for p in patterns for u in braceexpand.braceexpand(p)]
    if not urls:
        raise ValueError(f"no WebDataset shards in {shards!r}")
    local = [u for u in urls if "://" not in u and not u.startswith("pipe:")]
    missing = [u for u in local if not Path(u).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} WebDataset shard(s) missing, e.g. {missing[0]} (expected tar "
            "files holding <key>.jpg + <key>.txt per sample)"
        )
    return urls


def webdataset_pairs(
    shards: str | Sequence[str],
    transform: Transform,
    num_samples: int,
    batch_size: int,
    world_size: int = 1,
    num_workers: int = 0,
    shuffle_buffer: int = 2000,
    resampled: bool = False,
    seed: int = 0,
    rank: int | None = None,
) -> torch.utils.data.IterableDataset:
    """Pairs streamed from WebDataset tar shards (``.jpg``/``.png`` + ``.txt``).

    Each rank sees ``ceil(num_samples / (world_size · batch_size · workers))
    · workers`` full batches per epoch, so DDP ranks always step together (as open_clip does
    with ``--train-num-samples``). Shards are split over ranks and workers and
    cycled (``resampled=False``) or sampled with replacement
    (``resampled=True``); an epoch is therefore ``num_samples`` draws, not an
    exact pass over the data. The group id of a sample hashes its key. Each epoch's
    shard order, sample order and views follow ``(seed, epoch)`` (``shard_stream.py``),
    so ``ResumableStreamLoader`` resumes mid-epoch where the run stopped.

    Raises:
        ValueError: fewer shards than ranks × workers without ``resampled``
            (some worker would have nothing to read).
    """
    from rl_gap.data.shard_stream import ShardStream

    urls = _shard_list(shards)
    readers = world_size * max(1, num_workers)
    if not resampled and len(urls) < readers:
        raise ValueError(
            f"{len(urls)} shard(s) cannot feed {world_size} rank(s) × {max(1, num_workers)} "
            "worker(s); use more shards, fewer workers, or resampled=True"
        )
    if num_samples < 1 or batch_size < 1:
        raise ValueError(f"num_samples and batch_size must be ≥ 1, got {num_samples}, {batch_size}")
    # Each worker yields whole batches, so every rank steps the same number of times.
    workers = max(1, num_workers)
    batches_per_worker = math.ceil(num_samples / (world_size * batch_size * workers))

    def to_sample(raw: dict[str, Any]) -> dict[str, Any]:
        key, url = raw["__key__"], raw.get("__url__", "?")
        data = next(raw[k] for k in ("jpg", "jpeg", "png", "webp") if k in raw)
        image = decode_image_bytes(data, f"{key!r} in {url}")
        caption = raw["txt"]
        text = caption.decode("utf-8") if isinstance(caption, bytes) else str(caption)
        return {"image": transform(image), "text": text, "group": stable_group_id(key)}

    return ShardStream(
        urls, to_sample, batches_per_worker * batch_size, batch_size, workers, world_size,
        rank, resampled, shuffle_buffer, seed,
    )  # fmt: skip


# --------------------------------------------------------------- evaluation
class EvalImages(Dataset):
    """Images of an evaluation set, one integer each under ``key``: item ``i`` ->
    ``{"image": (3, H, W) tensor, key: int, "index": i}``.

    Args:
        images: paths, PIL images or tensors (:func:`load_image`).
        values: one integer per image (``key`` names it in the batch).
        transform: PIL image -> (3, H, W) tensor.
        name: the name metrics are logged under (``eval_name``).
    """

    key: str

    def __init__(
        self,
        images: Sequence[ImageItem],
        values: Sequence[int],
        transform: Transform | None,
        name: str,
    ) -> None:
        if len(images) != len(values) or len(images) == 0:
            raise ValueError(
                f"{type(self).__name__} needs one {self.key} per image and ≥1 image, got "
                f"{len(images)} images and {len(values)} {self.key}s"
            )
        self.images, self.values = list(images), [int(v) for v in values]
        self.transform, self.eval_name = transform, name

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "image": load_image(self.images[i], self.transform),
            self.key: self.values[i],
            "index": i,
        }


class RetrievalImages(EvalImages):
    """The image side of a retrieval set: images with their caption-group ids (``groups``)."""

    eval_role = RETRIEVAL_IMAGES
    key = "group"

    def __init__(
        self,
        images: Sequence[ImageItem],
        groups: Sequence[int],
        transform: Transform | None = None,
        name: str = "retrieval",
    ) -> None:
        super().__init__(images, groups, transform, name)

    @property
    def groups(self) -> list[int]:
        return self.values


class RetrievalTexts(Dataset):
    """The text side of a retrieval set: captions with their group ids."""

    eval_role = RETRIEVAL_TEXTS

    def __init__(self, captions: Sequence[str], groups: Sequence[int], name: str = "retrieval"):
        if len(captions) != len(groups) or len(captions) == 0:
            raise ValueError(
                f"retrieval texts need one group id per caption and ≥1 caption, got "
                f"{len(captions)} captions and {len(groups)} groups"
            )
        self.captions, self.groups = list(captions), [int(g) for g in groups]
        self.eval_name = name

    def __len__(self) -> int:
        return len(self.captions)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"text": self.captions[i], "group": self.groups[i], "index": i}


def read_karpathy_split(
    annotations: str | os.PathLike, image_root: str | os.PathLike, split: str | Sequence[str]
) -> tuple[list[str], list[str], list[int]]:
    """Images, captions and each caption's image index from a Karpathy-split JSON.

    Layout (``dataset_flickr30k.json`` / ``dataset_coco.json``): ``{"images":
    [{"filename": ..., "filepath": ... (COCO only), "split": "train" | "val" |
    "test" | "restval", "sentences": [{"raw": caption}, ...]}, ...]}``.
    Image paths are ``image_root/[filepath/]filename``.

    Returns:
        (image paths (I,), captions (T,), caption -> image index (T,)).
    """
    annotations = Path(annotations)
    if not annotations.is_file():
        raise FileNotFoundError(
            f"Karpathy-split annotations not found: {annotations} (expected e.g. "
            "dataset_flickr30k.json with an 'images' list)"
        )
    with open(annotations, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise ValueError(f"{annotations} has no 'images' list (not a Karpathy-split file)")
    splits = {split} if isinstance(split, str) else set(split)
    root = Path(image_root)
    images: list[str] = []
    captions: list[str] = []
    owners: list[int] = []
    for entry in data["images"]:
        if entry.get("split") not in splits:
            continue
        sentences = [s["raw"].strip() for s in entry.get("sentences", [])]
        if not sentences:
            raise ValueError(f"{annotations}: image {entry.get('filename')!r} has no sentences")
        image_index = len(images)
        images.append(str(root / entry.get("filepath", "") / entry["filename"]))
        captions.extend(sentences)
        owners.extend([image_index] * len(sentences))
    if not images:
        found = sorted({str(e.get("split")) for e in data["images"]})
        raise ValueError(f"{annotations} has no image in split(s) {sorted(splits)}; has {found}")
    return images, captions, owners


def retrieval_pair(
    images: Sequence[ImageItem],
    captions: Sequence[str],
    owners: Sequence[int],
    transform: Transform | None,
    name: str,
) -> tuple[RetrievalImages, RetrievalTexts]:
    """The (images, captions) evaluation pair where caption ``t`` belongs to image
    ``owners[t]``: each image is its own caption group."""
    return (
        RetrievalImages(images, list(range(len(images))), transform, name),
        RetrievalTexts(captions, owners, name),
    )


def karpathy_retrieval_sets(
    annotations: str | os.PathLike,
    image_root: str | os.PathLike,
    split: str = "test",
    transform: Transform | None = None,
    name: str = "retrieval",
) -> tuple[RetrievalImages, RetrievalTexts]:
    """The (images, captions) evaluation pair of a Karpathy split; group = image."""
    return retrieval_pair(*read_karpathy_split(annotations, image_root, split), transform, name)


class KarpathyPairs(Dataset):
    """Training pairs from a Karpathy split: one sample per caption, grouped by image."""

    def __init__(
        self,
        annotations: str | os.PathLike,
        image_root: str | os.PathLike,
        split: str | Sequence[str] = ("train", "restval"),
        transform: Transform | None = None,
    ) -> None:
        self.images, self.captions, self.owners = read_karpathy_split(
            annotations, image_root, split
        )
        self.transform = transform

    def __len__(self) -> int:
        return len(self.captions)

    def __getitem__(self, i: int) -> dict[str, Any]:
        owner = self.owners[i]
        return {
            "image": load_image(self.images[owner], self.transform),
            "text": self.captions[i],
            "group": owner,
        }
