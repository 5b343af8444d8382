"""The datasets behind the metric-learning DataModules (:mod:`rl_gap.data.metric_learning`).

Every item is ``(image, label, index)`` and every dataset carries a ``labels`` (N,) tensor:
images read from files (:class:`ImageListDataset`), in-memory tensors
(:class:`TensorImageDataset`), a re-indexed subset of rows (:class:`SubsetDataset`), and the
seeded choice of k queries per class (:func:`select_queries`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import Dataset

from rl_gap.data.ml_layouts import ImageList, missing_files, open_rgb


class ImageListDataset(Dataset):
    """Images read from files with PIL (RGB); returns ``(transform(image), label, index)``."""

    def __init__(
        self, items: ImageList, transform: Callable[[Any], torch.Tensor], check_files: bool = True
    ) -> None:
        self.paths = list(items.paths)
        self.labels = torch.as_tensor(items.labels, dtype=torch.long)
        self.transform = transform
        if check_files:  # found at setup, not mid-epoch (one os.path.exists per file)
            missing = missing_files(self.paths)
            if missing:
                raise FileNotFoundError(
                    f"{len(missing)} of {len(self.paths)} images listed in the dataset are "
                    f"missing: {', '.join(map(str, missing[:5]))}"
                    f"{' ...' if len(missing) > 5 else ''} (check_files=false skips this check)"
                )

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        path = self.paths[index]
        if not path.is_file():
            raise FileNotFoundError(f"image listed in the dataset is missing: {path}")
        x = self.transform(open_rgb(path))  # a corrupt/truncated file: OSError naming it
        return x, int(self.labels[index]), index


class TensorImageDataset(Dataset):
    """In-memory images (N, C, H, W) already normalised; returns ``(image, label, index)``."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if images.ndim != 4 or images.shape[0] != labels.shape[0]:
            raise ValueError(
                f"images must be (N, C, H, W) with N = len(labels); got {tuple(images.shape)} "
                f"and {tuple(labels.shape)}"
            )
        self.images = images
        self.labels = labels.long()

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        return self.images[index], int(self.labels[index]), index


def select_queries(labels: torch.Tensor, per_class: int, seed: int = 0) -> torch.Tensor:
    """Sorted indices of ``per_class`` random items of every class (all of a smaller class)."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(labels), generator=g)
    picked = []
    seen: dict[int, int] = {}
    for i, y in zip(order.tolist(), labels[order].tolist()):
        if seen.get(y, 0) < per_class:
            seen[y] = seen.get(y, 0) + 1
            picked.append(i)
    return torch.tensor(sorted(picked), dtype=torch.long)


class SubsetDataset(Dataset):
    """Rows ``keep`` of a dataset, re-indexed 0..n-1 (indices stay unique per split)."""

    def __init__(self, base: Dataset, keep: torch.Tensor) -> None:
        self.base = base
        self.rows = torch.nonzero(keep).flatten()
        self.labels = base.labels[self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int):
        x, y, _ = self.base[int(self.rows[index])]
        return x, y, index
