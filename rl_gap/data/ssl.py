"""Self-supervised data: MoCo v3's two-crop augmentation and the dataset wrappers.

MoCo v3 (Chen, Xie & He 2021) draws two views of every image with two
slightly different pipelines (BYOL's asymmetric recipe):

=====================  ==========  ==========
step                   view 1      view 2
=====================  ==========  ==========
RandomResizedCrop      scale (crop_min, 1)
ColorJitter(.4,.4,.2,.1)  p = 0.8  p = 0.8
RandomGrayscale        p = 0.2     p = 0.2
GaussianBlur σ∈[.1,2]  p = 1.0     p = 0.1
Solarize               p = 0       p = 0.2
HorizontalFlip         p = 0.5     p = 0.5
=====================  ==========  ==========

Sizes are given for 224-pixel crops; :func:`moco_v3_augmentations` scales the
blur kernel and σ range with the crop size, so 28-pixel digits get a 3-pixel
kernel. Batches are dicts: training ``{"views": [x1, x2], "label": y}``,
evaluation ``{"image": x, "label": y}``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms as T

from rl_gap.data.resumable import check_batching, per_device_batch, resumable_train_loader

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def blur_kernel_size(image_size: int) -> int:
    """Odd kernel of about 10% of the crop (23 at 224, 3 at 28), as in BYOL/SimCLR."""
    return 2 * max(1, round(0.05 * image_size)) + 1


def moco_v3_augmentations(
    image_size: int = 224,
    crop_min: float = 0.08,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    interpolation: str = "bilinear",
) -> tuple[Callable, Callable]:
    """The two MoCo v3 view pipelines (PIL image -> normalised tensor).

    Args:
        image_size: output crop side (224 for ImageNet, 28 for MNIST).
        crop_min: smallest RandomResizedCrop area fraction (MoCo v3 ViT: 0.08).
        mean, std: per-channel normalisation (one entry per channel).
        interpolation: the crop's resize filter (the backbone's: ``bicubic`` for most ViTs).

    Returns:
        (view-1 transform, view-2 transform).
    """
    if not 0 < crop_min <= 1:
        raise ValueError(f"crop_min must lie in (0, 1], got {crop_min}")
    sigma_scale = image_size / 224.0
    sigma = (0.1 * sigma_scale, 2.0 * sigma_scale)
    kernel = blur_kernel_size(image_size)

    def pipeline(blur_p: float, solarize_p: float) -> T.Compose:
        steps: list[Any] = [
            T.RandomResizedCrop(
                image_size, scale=(crop_min, 1.0), interpolation=T.InterpolationMode(interpolation)
            ),
            T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
            T.RandomGrayscale(p=0.2),
            T.RandomApply([T.GaussianBlur(kernel, sigma=sigma)], p=blur_p),
        ]
        if solarize_p > 0:
            # On PIL uint8 images: invert every pixel >= 128.
            steps.append(T.RandomSolarize(threshold=128, p=solarize_p))
        steps += [T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)]
        return T.Compose(steps)

    return pipeline(blur_p=1.0, solarize_p=0.0), pipeline(blur_p=0.1, solarize_p=0.2)


def eval_transform(
    image_size: int = 224,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    crop_ratio: float = 0.875,
) -> T.Compose:
    """Resize to ``image_size / crop_ratio`` then centre-crop (256 -> 224 on ImageNet)."""
    steps: list[Any] = []
    if crop_ratio < 1:
        steps += [T.Resize(round(image_size / crop_ratio)), T.CenterCrop(image_size)]
    else:
        steps += [T.Resize(image_size), T.CenterCrop(image_size)]
    return T.Compose([*steps, T.ToTensor(), T.Normalize(mean, std)])


class LabelledImagesView(Dataset, abc.ABC):
    """A labelled image dataset (``base[i]`` -> ``(PIL image, label)``) seen through
    :meth:`item`, which turns one image, its label and its index into a batch entry."""

    def __init__(self, base: Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> dict[str, Any]:
        image, label = self.base[index]
        return self.item(image, int(label), index)

    @abc.abstractmethod
    def item(self, image: Any, label: int, index: int) -> dict[str, Any]:
        """The batch entry of ``base[index]``."""


class TwoCropDataset(LabelledImagesView):
    """Wraps a labelled image dataset; item ``i`` -> ``{"views": [v1, v2], "label": y}``.

    Args:
        base: dataset returning ``(PIL image, label)``.
        view1, view2: the two augmentation pipelines.
    """

    def __init__(self, base: Dataset, view1: Callable, view2: Callable) -> None:
        super().__init__(base)
        self.view1, self.view2 = view1, view2

    def item(self, image: Any, label: int, index: int) -> dict[str, Any]:
        return {"views": [self.view1(image), self.view2(image)], "label": label}


class EvalDataset(LabelledImagesView):
    """Wraps a labelled image dataset; item ``i`` -> ``{"image": x, "label": y, "index": i}``."""

    def __init__(self, base: Dataset, transform: Callable) -> None:
        super().__init__(base)
        self.transform = transform

    def item(self, image: Any, label: int, index: int) -> dict[str, Any]:
        return {"image": self.transform(image), "label": label, "index": index}


def fixed_subset_indices(n: int, size: int | None, seed: int = 0) -> list[int]:
    """A reproducible random subset of ``range(n)`` (all of it when ``size`` is None or ≥ n)."""
    if size is None or size >= n:
        return list(range(n))
    if size <= 0:
        raise ValueError(f"subset size must be positive, got {size}")
    generator = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(n, generator=generator)[:size].tolist())


class SSLDataModule(L.LightningDataModule):
    """Shared loaders: two-crop training batches and the two kNN evaluation splits.

    Subclasses set ``self.train_set`` (a :class:`TwoCropDataset`),
    ``self.bank_set`` and ``self.query_set`` (:class:`EvalDataset`) in
    ``setup``. ``val_dataloader`` returns ``[bank, queries]``: dataloader 0 is
    the labelled kNN bank (training images, evaluation transform), dataloader 1
    the evaluated images.

    Args:
        batch_size: the *global* training batch (all devices together), the batch whose
            keys the loss ranks; each of the ``devices × nodes`` ranks loads
            ``batch_size / ranks`` (printed at start-up).
        num_workers: loader processes.
        eval_batch_size: per-device batch of the evaluation loaders (default: the
            per-device training batch).
        pin_memory: pin host memory (on for GPU training).
        batches_per_epoch: training batches per epoch (default: as many full global
            batches as the training set holds).
    """

    batch_is_global = True  # rl-gap fit refuses a batch the ranks cannot share

    def __init__(
        self,
        batch_size: int = 256,
        num_workers: int = 0,
        eval_batch_size: int | None = None,
        pin_memory: bool = False,
        batches_per_epoch: int | None = None,
    ) -> None:
        super().__init__()
        check_batching(batch_size, batches_per_epoch)
        self.batches_per_epoch = batches_per_epoch
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.eval_batch_size = eval_batch_size
        self.pin_memory = pin_memory
        self.train_set: Dataset | None = None
        self.bank_set: Dataset | None = None
        self.query_set: Dataset | None = None

    def _loader(self, dataset: Dataset | None, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() has not built the datasets")
        return DataLoader(
            dataset,
            batch_size=self.batch_size if train else self._eval_batch(),
            shuffle=train,
            # MoCo v3 drops the ragged last batch: every step sees a full batch.
            drop_last=train,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
        )

    shards_training_batches = True  # the resumable loader shards; no DistributedSampler

    def _eval_batch(self) -> int:
        if self.eval_batch_size:
            return self.eval_batch_size
        return per_device_batch(self, self.batch_size)

    def train_dataloader(self) -> DataLoader:
        """Shuffled, seeded two-crop batches whose position is checkpointed (exact resume)."""
        if self.train_set is None:
            raise RuntimeError(f"{type(self).__name__}.setup() has not built the datasets")
        return resumable_train_loader(
            self,
            self.train_set,
            per_device_batch(self, self.batch_size),
            seed=int(getattr(self, "seed", 0)),
            batches_per_epoch=self.batches_per_epoch,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
        )

    def val_dataloader(self) -> list[DataLoader]:
        return [self._loader(self.bank_set, train=False), self._loader(self.query_set, train=False)]

    # ``rl-gap predict``: features of the kNN bank (training images) and of the evaluated images.
    predict_split_names = ("train", "val")

    def predict_dataloader(self) -> list[DataLoader]:
        return self.val_dataloader()
