"""The bundled MNIST-5k digits: shape, value range, ten classes, fresh copies per call."""

from __future__ import annotations

import numpy as np

from rl_gap.data.mnist import load_mnist_5k


def test_five_thousand_digits_of_ten_classes_as_fresh_copies():
    images, labels = load_mnist_5k()
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (5000,) and labels.dtype == np.int64
    assert sorted(set(labels.tolist())) == list(range(10))
    assert min(np.bincount(labels)) > 300  # every digit well represented
    assert images.max() > 200 and (images == 0).mean() > 0.5  # ink on a black background
    images[0] = 7
    again, _ = load_mnist_5k()
    assert not (again[0] == 7).all()  # a caller's edit never reaches the cache
