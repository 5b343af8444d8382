"""The metric-learning datasets: in-memory tensors, re-indexed row subsets, query choice."""

import pytest
import torch

from rl_gap.data.ml_datasets import SubsetDataset, TensorImageDataset, select_queries


def test_select_queries_takes_k_per_class():
    labels = torch.tensor([0] * 6 + [1] * 2 + [2] * 5)
    picked = select_queries(labels, 4, seed=1)
    assert torch.bincount(labels[picked]).tolist() == [4, 2, 4]
    assert torch.equal(picked, torch.sort(picked).values)


def test_tensor_images_and_a_subset_of_them_are_indexed_from_zero():
    images = torch.arange(5.0).view(5, 1, 1, 1)
    data = TensorImageDataset(images, torch.tensor([3, 1, 3, 2, 1]))
    assert [(float(x), y, i) for x, y, i in (data[k] for k in range(5))][1] == (1.0, 1, 1)
    part = SubsetDataset(data, torch.tensor([False, True, False, True, True]))
    assert len(part) == 3 and part.labels.tolist() == [1, 2, 1]
    assert [(float(x), y, i) for x, y, i in (part[k] for k in range(3))] == [
        (1.0, 1, 0), (3.0, 2, 1), (4.0, 1, 2),
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"images must be \(N, C, H, W\) with N = len\(labels\)"):
        TensorImageDataset(images[:4], torch.zeros(5))
