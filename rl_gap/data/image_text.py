"""Image–text pairs for CLIP fine-tuning and retrieval evaluation.

Training pairs come from a CSV/TSV of (image path, caption), the layout
open_clip's ``--train-data`` reads (``--csv-img-key filepath
--csv-caption-key title``), or from WebDataset tar shards holding ``.jpg`` +
``.txt`` per sample (CC12M scale). Evaluation sets use the Karpathy-split JSON
of Flickr30k / COCO (``dataset_flickr30k.json``, ``dataset_coco.json``): each
image has ~5 captions and relevance is the image–caption group.

Batch protocol (what ``CLIPFineTuneModule`` consumes):
- training: ``{"image": (B,3,H,W), "text": (B,L) int64 or list[str],
  "group": (B,) int64}``; image i and caption j are relevant iff
  ``group[i] == group[j]`` (the same sample, or the same caption group);
- evaluation: datasets carry ``eval_role`` (``"retrieval_images"``,
  ``"retrieval_texts"`` or ``"zero_shot"``) and ``eval_name``; batches add an
  ``"index"`` (position in the dataset) so DDP padding can be undone, and
  ``"label"`` for zero-shot classification.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

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
        with Image.open(path) as img:
            item = img.convert("RGB")
    out = transform(item) if transform is not None else item
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"the image transform must return a tensor, got {type(out).__name__}")
    return out


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
) -> torch.utils.data.IterableDataset:
    """Pairs streamed from WebDataset tar shards (``.jpg``/``.png`` + ``.txt``).

    Each rank sees ``ceil(num_samples / (world_size · batch_size · workers))
    · workers`` full batches per epoch, so DDP ranks always step together (as open_clip does
    with ``--train-num-samples``). Shards are split over ranks and workers and
    cycled (``resampled=False``) or sampled with replacement
    (``resampled=True``); an epoch is therefore ``num_samples`` draws, not an
    exact pass over the data. The group id of a sample hashes its key.

    Raises:
        ValueError: fewer shards than ranks × workers without ``resampled``
            (some worker would have nothing to read).
    """
    import webdataset as wds

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
    samples_per_worker = batches_per_worker * batch_size

    def to_sample(item: tuple[Image.Image, str, str]) -> dict[str, Any]:
        image, caption, key = item
        return {"image": transform(image), "text": caption, "group": stable_group_id(key)}

    pipeline = wds.WebDataset(
        urls,
        resampled=resampled,
        shardshuffle=1000 if not resampled else False,
        nodesplitter=wds.split_by_node if not resampled else None,
        seed=seed,
        empty_check=False,
    )
    if shuffle_buffer > 0:
        pipeline = pipeline.shuffle(shuffle_buffer)
    pipeline = (
        pipeline.decode("pilrgb")
        .to_tuple("jpg;jpeg;png;webp", "txt", "__key__")
        .map(to_sample)
        .with_epoch(samples_per_worker)  # cycles the worker's shards, cut at this count
        .with_length(samples_per_worker * workers)
    )
    return pipeline


# --------------------------------------------------------------- evaluation
class RetrievalImages(Dataset):
    """The image side of a retrieval set: images with their caption-group ids."""

    eval_role = RETRIEVAL_IMAGES

    def __init__(
        self,
        images: Sequence[ImageItem],
        groups: Sequence[int],
        transform: Transform | None = None,
        name: str = "retrieval",
    ) -> None:
        if len(images) != len(groups) or len(images) == 0:
            raise ValueError(
                f"retrieval images need one group id per image and ≥1 image, got "
                f"{len(images)} images and {len(groups)} groups"
            )
        self.images, self.groups = list(images), [int(g) for g in groups]
        self.transform, self.eval_name = transform, name

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "image": load_image(self.images[i], self.transform),
            "group": self.groups[i],
            "index": i,
        }


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


def karpathy_retrieval_sets(
    annotations: str | os.PathLike,
    image_root: str | os.PathLike,
    split: str = "test",
    transform: Transform | None = None,
    name: str = "retrieval",
) -> tuple[RetrievalImages, RetrievalTexts]:
    """The (images, captions) evaluation pair of a Karpathy split; group = image."""
    images, captions, owners = read_karpathy_split(annotations, image_root, split)
    return (
        RetrievalImages(images, list(range(len(images))), transform, name),
        RetrievalTexts(captions, owners, name),
    )


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


# -------------------------------------------------------------- DataModules
class CLIPDataModuleBase(L.LightningDataModule):
    """Loaders shared by the CLIP data modules.

    Preprocessing (image size, mean/std) and the tokenizer default to the
    model's: ``CLIPFineTuneModule.setup`` calls ``configure_for_model`` so a
    recipe names the architecture once. Explicit arguments here win.

    Args:
        batch_size: per-process training batch (global = × devices × nodes).
        eval_batch_size: per-process evaluation batch (default: batch_size).
        num_workers: DataLoader workers.
        image_size, mean, std: override the model's preprocessing.
        tokenizer: an open_clip model name whose tokenizer to use (default:
            the model's tokenizer).
    """

    def __init__(
        self,
        batch_size: int = 256,
        eval_batch_size: int | None = None,
        num_workers: int = 4,
        image_size: int | None = None,
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        tokenizer: str | None = None,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size or batch_size)
        self.num_workers = int(num_workers)
        self.image_size, self.mean, self.std = image_size, mean, std
        self.tokenizer = None
        if tokenizer is not None:
            import open_clip

            self.tokenizer = open_clip.get_tokenizer(tokenizer)
        self._eval_sets: list[Dataset] | None = None

    def configure_for_model(
        self,
        tokenizer: Callable[[list[str]], torch.Tensor],
        image_size: int,
        mean: Sequence[float],
        std: Sequence[float],
    ) -> None:
        """Adopt the model's tokenizer and preprocessing where none was given."""
        self.tokenizer = self.tokenizer or tokenizer
        self.image_size = self.image_size or image_size
        self.mean = tuple(self.mean or mean)
        self.std = tuple(self.std or std)

    def _preprocess(self) -> tuple[int, tuple[float, ...], tuple[float, ...]]:
        from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

        return (
            int(self.image_size or 224),
            tuple(self.mean or OPENAI_DATASET_MEAN),
            tuple(self.std or OPENAI_DATASET_STD),
        )

    def image_transform(self, train: bool) -> Transform:
        """open_clip's train (random resized crop) / eval (resize + centre crop) transform."""
        from open_clip.transform import image_transform

        size, mean, std = self._preprocess()
        return image_transform(size, is_train=train, mean=mean, std=std)

    # subclasses provide the data
    def train_dataset(self) -> Dataset:
        raise NotImplementedError

    def eval_datasets(self) -> list[Dataset]:
        """Evaluation datasets, each with ``eval_role`` and ``eval_name``."""
        return []

    def _loader(self, dataset: Dataset, batch_size: int, train: bool) -> DataLoader:
        iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=train and not iterable,
            drop_last=train,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=PairCollate(self.tokenizer),
            pin_memory=torch.cuda.is_available(),
        )

    def train_dataloader(self) -> DataLoader:
        dataset = self.train_dataset()
        if not isinstance(dataset, torch.utils.data.IterableDataset):
            if len(dataset) < self.batch_size:
                raise ValueError(
                    f"training set has {len(dataset)} pairs, fewer than batch_size="
                    f"{self.batch_size} (incomplete batches are dropped)"
                )
        return self._loader(dataset, self.batch_size, train=True)

    def val_dataloader(self) -> list[DataLoader]:
        if self._eval_sets is None:
            self._eval_sets = self.eval_datasets()
        return [self._loader(d, self.eval_batch_size, train=False) for d in self._eval_sets]

    def test_dataloader(self) -> list[DataLoader]:
        return self.val_dataloader()


class ImageTextDataModule(CLIPDataModuleBase):
    """CLIP fine-tuning data: caption table or WebDataset shards; Karpathy-split
    retrieval sets and folder-per-class zero-shot sets for evaluation.

    Args:
        train_table: CSV/TSV of (image path, caption) pairs.
        train_shards: WebDataset shards (brace pattern or list); needs
            ``train_num_samples``.
        train_num_samples: samples per epoch of the shards.
        image_root, image_key, caption_key, separator: caption-table options.
        resampled, shuffle_buffer, seed: WebDataset options.
        retrieval: evaluation sets, each ``{name, annotations (Karpathy JSON),
            image_root, split: test}``.
        zero_shot: evaluation sets, each ``{name, root, classnames: null|file|
            list, templates: openai_imagenet|simple|[...]}``.
        (see ``CLIPDataModuleBase`` for the rest)
    """

    def __init__(
        self,
        train_table: str | None = None,
        train_shards: str | list[str] | None = None,
        train_num_samples: int | None = None,
        image_root: str | None = None,
        image_key: str = "filepath",
        caption_key: str = "title",
        separator: str | None = None,
        resampled: bool = False,
        shuffle_buffer: int = 2000,
        seed: int = 0,
        retrieval: list[dict[str, Any]] | None = None,
        zero_shot: list[dict[str, Any]] | None = None,
        batch_size: int = 256,
        eval_batch_size: int | None = None,
        num_workers: int = 4,
        image_size: int | None = None,
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        tokenizer: str | None = None,
    ) -> None:
        super().__init__(batch_size, eval_batch_size, num_workers, image_size, mean, std, tokenizer)
        if train_table is not None and train_shards is not None:
            raise ValueError("give train_table or train_shards, not both")
        if train_shards is not None and not train_num_samples:
            raise ValueError("train_shards needs train_num_samples (samples per epoch)")
        self.train_table, self.train_shards = train_table, train_shards
        self.train_num_samples = train_num_samples
        self.table_options = dict(
            image_root=image_root, image_key=image_key, caption_key=caption_key, separator=separator
        )
        self.resampled, self.shuffle_buffer, self.seed = resampled, shuffle_buffer, seed
        self.retrieval = [dict(r) for r in retrieval or []]
        self.zero_shot = [dict(z) for z in zero_shot or []]
        for spec in self.retrieval:
            missing = {"annotations", "image_root"} - set(spec)
            if missing:
                raise ValueError(f"retrieval set {spec} lacks key(s) {sorted(missing)}")
        for spec in self.zero_shot:
            if "root" not in spec:
                raise ValueError(f"zero-shot set {spec} lacks the 'root' folder")

    def train_dataset(self) -> Dataset:
        transform = self.image_transform(train=True)
        if self.train_table is not None:
            return CaptionTableDataset(self.train_table, transform=transform, **self.table_options)
        if self.train_shards is not None:
            trainer = self.trainer
            return webdataset_pairs(
                self.train_shards,
                transform,
                num_samples=int(self.train_num_samples),
                batch_size=self.batch_size,
                world_size=trainer.world_size if trainer is not None else 1,
                num_workers=self.num_workers,
                shuffle_buffer=self.shuffle_buffer,
                resampled=self.resampled,
                seed=self.seed,
            )
        raise ValueError("no training data: set train_table or train_shards")

    def eval_datasets(self) -> list[Dataset]:
        from rl_gap.data.zero_shot import FolderClassification

        transform = self.image_transform(train=False)
        sets: list[Dataset] = []
        for spec in self.retrieval:
            images, texts = karpathy_retrieval_sets(
                spec["annotations"],
                spec["image_root"],
                split=spec.get("split", "test"),
                transform=transform,
                name=spec.get("name", Path(spec["annotations"]).stem),
            )
            sets += [images, texts]
        for spec in self.zero_shot:
            sets.append(
                FolderClassification(
                    spec["root"],
                    transform,
                    classnames=spec.get("classnames"),
                    templates=spec.get("templates", "openai_imagenet"),
                    name=spec.get("name", Path(spec["root"]).name),
                )
            )
        return sets
