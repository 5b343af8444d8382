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

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from rl_gap.data.image_text_sets import (  # re-exported: one import path for users
    RETRIEVAL_IMAGES,
    RETRIEVAL_TEXTS,
    ZERO_SHOT,
    CaptionTableDataset,
    ImageItem,
    KarpathyPairs,
    PairCollate,
    RetrievalImages,
    RetrievalTexts,
    Transform,
    karpathy_retrieval_sets,
    load_image,
    read_caption_table,
    read_karpathy_split,
    retrieval_pair,
    stable_group_id,
    webdataset_pairs,
)
from rl_gap.data.preprocess import FollowsModelPreprocess, recipe_values
from rl_gap.data.resumable import check_batching
from rl_gap.data.shard_stream import ResumableStreamLoader, ShardStream
from rl_gap.models.preprocess import Preprocess, PreprocessError, find_preprocess


def open_clip_defaults() -> Preprocess:
    """open_clip's ``PreprocessCfg()`` defaults (OpenAI statistics, bicubic, 224 pixels)."""
    from open_clip.transform import PreprocessCfg

    from rl_gap.models.preprocess import open_clip_preprocess

    pp = open_clip_preprocess(vars(PreprocessCfg()), "the model")
    return pp.with_values({}, "open_clip's defaults")


# -------------------------------------------------------------- DataModules
class CLIPDataModuleBase(FollowsModelPreprocess, L.LightningDataModule):
    """Loaders shared by the CLIP data modules.

    Preprocessing and the tokenizer default to the model's: open_clip's preprocess
    config of the architecture and pretrained tag (size, mean, std, interpolation, resize
    mode), and open_clip's transforms built from it (``image_transform_v2``), so a recipe
    names the architecture once. Explicit arguments here win.

    Args:
        batch_size: the *global* training batch (all devices together), the batch the loss
            ranks; each of the ``devices × nodes`` ranks loads ``batch_size / ranks``
            (printed at start-up).
        eval_batch_size: per-device evaluation batch (default: the per-device training batch).
        batches_per_epoch: training batches per epoch of a caption table (default: as many
            full global batches as it holds); WebDataset shards set ``train_num_samples``.
        num_workers: DataLoader workers.
        image_size, mean, std, interpolation, resize_mode: override the model's
            preprocessing (``resize_mode``: open_clip's ``shortest``, ``longest``, ``squash``).
        preprocess: the same overrides as one section.
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
        interpolation: str | None = None,
        resize_mode: str | None = None,
        preprocess: dict[str, Any] | None = None,
        batches_per_epoch: int | None = None,
    ) -> None:
        super().__init__()
        check_batching(batch_size, batches_per_epoch)
        self.batches_per_epoch = batches_per_epoch
        self.batch_size = int(batch_size)
        self._eval_batch_size = eval_batch_size
        self.num_workers = int(num_workers)
        overrides = recipe_values(
            preprocess, image_size=image_size, mean=mean, std=std,
            interpolation=interpolation, resize_mode=resize_mode,
        )  # fmt: skip
        if overrides.get("crop_pct", 1.0) != 1.0:
            raise PreprocessError(
                "crop_pct applies to timm backbones; open_clip's transforms keep the resized "
                "image whole (set resize_mode: shortest, longest or squash)"
            )
        self.init_preprocess(overrides, open_clip_defaults())
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
        """Adopt the model's tokenizer, and its preprocessing unless the model's full
        :class:`~rl_gap.models.preprocess.Preprocess` was handed over already (``rl-gap fit``
        does that before training); explicit arguments win."""
        self.tokenizer = self.tokenizer or tokenizer
        if self._model_preprocess is None:
            trainer = getattr(self, "trainer", None)
            found = find_preprocess(getattr(trainer, "lightning_module", None))
            if found is None:
                found = open_clip_defaults().with_values(
                    {"image_size": image_size, "mean": mean, "std": std}, "the model"
                )
            self.configure_preprocess(found)

    def configure_preprocess(self, model: Preprocess | None) -> Preprocess:
        pp = super().configure_preprocess(model)
        self.image_size, self.mean, self.std = pp.image_size, pp.mean, pp.std
        return pp

    def _preprocess(self) -> tuple[int, tuple[float, ...], tuple[float, ...]]:
        pp = self.preprocessing
        return pp.image_size, pp.mean, pp.std

    def image_transform(self, train: bool) -> Transform:
        """open_clip's own train (random resized crop) / eval (resize + centre crop)
        transform of the preprocessing in use (``open_clip.transform.image_transform_v2``)."""
        from open_clip.transform import PreprocessCfg, image_transform_v2

        pp = self.preprocessing
        cfg = PreprocessCfg(
            size=pp.image_size, mean=pp.mean, std=pp.std, interpolation=pp.interpolation,
            resize_mode=pp.resize_mode,
        )  # fmt: skip
        return image_transform_v2(cfg, is_train=train)

    batch_is_global = True  # rl-gap fit refuses a batch the ranks cannot share

    @property
    def device_batch_size(self) -> int:
        """Each rank's share of the global ``batch_size``."""
        from rl_gap.data.resumable import per_device_batch

        return per_device_batch(self, self.batch_size)

    @property
    def eval_batch_size(self) -> int:
        """Per-device evaluation batch (default: the per-device training batch)."""
        return int(self._eval_batch_size or self.device_batch_size)

    # subclasses provide the data
    def train_dataset(self) -> Dataset:
        """The training dataset (batches follow the protocol in the module docstring).

        Evaluation-only subclasses need not provide one.
        """
        raise RuntimeError(f"{type(self).__name__} has no training data (evaluation only)")

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
        if self.batches_per_epoch is not None and isinstance(
            dataset, torch.utils.data.IterableDataset
        ):
            raise ValueError(
                "batches_per_epoch applies to a caption table; WebDataset shards set the "
                "epoch with train_num_samples"
            )
        if isinstance(dataset, ShardStream):  # WebDataset shards: a resumable stream
            return ResumableStreamLoader(
                dataset,
                num_workers=self.num_workers,
                collate_fn=PairCollate(self.tokenizer),
                pin_memory=torch.cuda.is_available(),
            )
        if isinstance(dataset, torch.utils.data.IterableDataset):
            return self._loader(dataset, self.device_batch_size, train=True)
        from rl_gap.data.resumable import resumable_train_loader

        return resumable_train_loader(
            self,
            dataset,
            self.device_batch_size,
            seed=int(getattr(self, "seed", 0) or 0),
            batches_per_epoch=self.batches_per_epoch,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=PairCollate(self.tokenizer),
            pin_memory=torch.cuda.is_available(),
        )

    shards_training_batches = True  # map-style training data: the resumable loader shards

    def val_dataloader(self) -> list[DataLoader]:
        if self._eval_sets is None:
            self._eval_sets = self.eval_datasets()
        return [self._loader(d, self.eval_batch_size, train=False) for d in self._eval_sets]

    def test_dataloader(self) -> list[DataLoader]:
        return self.val_dataloader()

    def predict_dataloader(self) -> list[DataLoader]:
        """``rl-gap predict``: every evaluation set, written under its ``eval_name``."""
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
        retrieval: evaluation sets, each either a held-out caption table ``{name, table
            (CSV/TSV, the training table's layout), image_root (default: the table's
            folder), image_key, caption_key, separator}`` or a Karpathy split ``{name,
            annotations (Karpathy JSON), image_root, split: test}``.
        zero_shot: evaluation sets, each ``{name, root, classnames: null|file|
            list, templates: openai_imagenet|simple|[...]}``.
        **kwargs: batching and preprocessing, as in :class:`CLIPDataModuleBase`.
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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
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
            if "table" in spec:
                continue
            missing = {"annotations", "image_root"} - set(spec)
            if missing:
                raise ValueError(
                    f"retrieval set {spec} lacks key(s) {sorted(missing)} (give a held-out "
                    "caption table as 'table', or a Karpathy JSON as 'annotations' + 'image_root')"
                )
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
                batch_size=self.device_batch_size,
                world_size=trainer.world_size if trainer is not None else 1,
                num_workers=self.num_workers,
                shuffle_buffer=self.shuffle_buffer,
                resampled=self.resampled,
                seed=self.seed,
                rank=trainer.global_rank if trainer is not None else 0,
            )
        raise ValueError("no training data: set train_table or train_shards")

    def eval_datasets(self) -> list[Dataset]:
        from rl_gap.data.zero_shot import FolderClassification

        transform = self.image_transform(train=False)
        sets: list[Dataset] = []
        for spec in self.retrieval:
            if "table" in spec:
                table = CaptionTableDataset(
                    spec["table"],
                    spec.get("image_root"),
                    spec.get("image_key", self.table_options["image_key"]),
                    spec.get("caption_key", self.table_options["caption_key"]),
                    spec.get("separator", self.table_options["separator"]),
                    transform=transform,
                )
                images, texts = table.retrieval_sets(spec.get("name", Path(spec["table"]).stem))
                sets += [images, texts]
                continue
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


__all__ = [
    "RETRIEVAL_IMAGES",
    "RETRIEVAL_TEXTS",
    "ZERO_SHOT",
    "CaptionTableDataset",
    "ImageItem",
    "KarpathyPairs",
    "PairCollate",
    "RetrievalImages",
    "RetrievalTexts",
    "Transform",
    "karpathy_retrieval_sets",
    "load_image",
    "read_caption_table",
    "read_karpathy_split",
    "retrieval_pair",
    "stable_group_id",
    "webdataset_pairs",
    "CLIPDataModuleBase",
    "ImageTextDataModule",
]
