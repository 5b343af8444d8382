"""Folder-per-class image datasets (the ImageNet layout) for MoCo v3 pretraining.

Expected layout::

    train_dir/<class_name>/<image>.{jpg,jpeg,png,...}
    val_dir/<class_name>/<image>.{jpg,jpeg,png,...}

Class indices follow the sorted class-folder names (torchvision
``ImageFolder``); the validation folders must use the training class names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import Subset
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

from rl_gap.data.ml_layouts import open_rgb
from rl_gap.data.preprocess import FollowsModelPreprocess, eval_transform, recipe_values
from rl_gap.data.ssl import (
    EvalDataset,
    SSLDataModule,
    TwoCropDataset,
    fixed_subset_indices,
    moco_v3_augmentations,
)

LAYOUT_HELP = (
    "expected <root>/<class_name>/<image file> (one sub-folder per class, ImageNet layout)"
)


def check_image_folder(root: str | Path) -> Path:
    """Validate a folder-per-class directory; return it as a Path.

    Raises:
        FileNotFoundError: missing directory, no class sub-folder, or a
            class tree without any image file.
    """
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist; {LAYOUT_HELP}")
    classes = sorted(p for p in root.iterdir() if p.is_dir())
    if not classes:
        raise FileNotFoundError(f"no class sub-folder in {str(root)!r}; {LAYOUT_HELP}")
    has_image = any(
        f.suffix.lower() in IMG_EXTENSIONS for c in classes for f in c.rglob("*") if f.is_file()
    )
    if not has_image:
        raise FileNotFoundError(
            f"no image file ({', '.join(IMG_EXTENSIONS)}) under {str(root)!r}; {LAYOUT_HELP}"
        )
    return root


class ImageFolderSSLDataModule(FollowsModelPreprocess, SSLDataModule):
    """MoCo v3 pretraining on a folder-per-class dataset, with kNN evaluation splits.

    Crops are resized and normalised as the model's backbone expects (timm's data config
    of it, :mod:`rl_gap.data.preprocess`) unless the recipe sets the values.

    Args:
        train_dir: training images (labels unused for training; they label the kNN bank).
        val_dir: evaluated images (kNN queries and retrieval evaluation).
        image_size: crop side (None: the backbone's input size).
        crop_min: RandomResizedCrop's smallest area (MoCo v3 ViT 0.08, ResNet 0.2).
        knn_bank_size: a fixed random subset of the training images used as the
            kNN bank during online evaluation (``None``: all of them).
        knn_query_size: likewise for the evaluated images.
        mean, std, interpolation, crop_pct: override the backbone's preprocessing (None: timm's
            data config of the backbone; ImageNet statistics, bilinear, 0.875, 224 pixels
            without a model). MoCo v3's recipes set ImageNet mean/std, as its paper's code.
        preprocess: the same overrides as one section.
        seed: seed of the subsets.
        batch_size, num_workers, eval_batch_size, pin_memory, batches_per_epoch: see
            :class:`SSLDataModule` (``batch_size`` is the global batch).
    """

    def __init__(
        self,
        train_dir: str,
        val_dir: str,
        image_size: int | None = None,
        crop_min: float = 0.08,
        knn_bank_size: int | None = None,
        knn_query_size: int | None = None,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        interpolation: str | None = None,
        crop_pct: float | None = None,
        preprocess: dict[str, Any] | None = None,
        seed: int = 0,
        batch_size: int = 256,
        num_workers: int = 8,
        eval_batch_size: int | None = None,
        pin_memory: bool = True,
        batches_per_epoch: int | None = None,
    ) -> None:
        super().__init__(batch_size, num_workers, eval_batch_size, pin_memory, batches_per_epoch)
        self.train_dir = train_dir
        self.val_dir = val_dir
        self.init_preprocess(
            recipe_values(
                preprocess,
                image_size=image_size,
                mean=mean,
                std=std,
                interpolation=interpolation,
                crop_pct=crop_pct,
            )  # fmt: skip
        )
        if not 0 < crop_min <= 1:
            raise ValueError(f"crop_min must lie in (0, 1], got {crop_min}")
        self.crop_min = crop_min
        self.knn_bank_size = knn_bank_size
        self.knn_query_size = knn_query_size
        self.seed = seed

    def setup(self, stage: str | None = None) -> None:
        train_root = check_image_folder(self.train_dir)
        val_root = check_image_folder(self.val_dir)
        # open_rgb: a corrupt or truncated file raises an error naming its path
        train = ImageFolder(str(train_root), loader=open_rgb)
        val = ImageFolder(str(val_root), loader=open_rgb)
        unknown = sorted(set(val.classes) - set(train.classes))
        if unknown:
            raise ValueError(
                f"{len(unknown)} validation class folder(s) not in the training folders, "
                f"e.g. {unknown[:5]}"
            )
        if val.class_to_idx != {c: train.class_to_idx[c] for c in val.classes}:
            # Same names, but a subset re-indexes: map to the training indices.
            val.samples = [(p, train.class_to_idx[val.classes[y]]) for p, y in val.samples]
            val.targets = [y for _, y in val.samples]
        pp = self.setup_preprocess()
        view1, view2 = moco_v3_augmentations(
            pp.image_size, self.crop_min, pp.mean, pp.std, pp.interpolation
        )
        evaluate = eval_transform(pp)
        self.train_set = TwoCropDataset(train, view1, view2)
        bank = Subset(train, fixed_subset_indices(len(train), self.knn_bank_size, self.seed))
        queries = Subset(val, fixed_subset_indices(len(val), self.knn_query_size, self.seed + 1))
        self.bank_set = EvalDataset(bank, evaluate)
        self.query_set = EvalDataset(queries, evaluate)
        for dataset in (self.bank_set, self.query_set):  # rl-gap knn / linear-probe re-point them
            dataset.preprocess_owner = self
