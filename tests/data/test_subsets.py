"""Scarce-data subsets: counts by hand, nesting, seeding, errors, and the DataModule applying them."""

from collections import Counter

import numpy as np
import pytest
import torch

from rl_gap.data.metric_learning import MNISTDemoDataModule
from rl_gap.data.mnist import load_mnist_5k
from rl_gap.data.subsets import kept_class_count, scarce_batch, scarce_subset

# class c (0..9) has c + 1 images, shuffled
SIZES = list(range(1, 11))
LABELS = torch.tensor(np.random.default_rng(0).permutation(np.repeat(np.arange(10), SIZES)))


def _counts(idx):
    return Counter(LABELS[idx].tolist())


def test_kept_classes_and_images_match_hand_counts():
    # rho = 4: classes 3..9 (sizes 4..10) are eligible, 7 of them; gamma = 0.5 -> 3.5 -> 4
    idx = scarce_subset(LABELS, class_fraction=0.5, images_per_class=4, seed=1)
    counts = _counts(idx)
    assert len(counts) == 4 and set(counts.values()) == {4}
    assert all(SIZES[c] >= 4 for c in counts)
    assert idx.tolist() == sorted(set(idx.tolist()))
    # rho = None: all 10 classes eligible, whole classes kept; 0.25 * 10 = 2.5 -> 3 (halves up)
    idx = scarce_subset(LABELS, class_fraction=0.25, seed=1)
    counts = _counts(idx)
    assert len(counts) == 3 and all(counts[c] == SIZES[c] for c in counts)
    # gamma = 1 % of 7 eligible -> 0 -> floor of 2 classes (a batch needs negatives)
    assert len(_counts(scarce_subset(LABELS, 0.01, 4, seed=1))) == 2
    assert kept_class_count(11318, 0.01) == 113  # SOP: 1 % of its training classes


def test_same_seed_same_subset_nested_over_gamma_and_rho():
    a = scarce_subset(LABELS, 0.5, 4, seed=7)
    assert torch.equal(a, scarce_subset(LABELS, 0.5, 4, seed=7))
    draws = {tuple(scarce_subset(LABELS, 0.5, 4, seed=s).tolist()) for s in range(6)}
    assert len(draws) > 1, "the seed must change the subset"
    small, large = scarce_subset(LABELS, 0.3, 4, seed=7), scarce_subset(LABELS, 0.9, 4, seed=7)
    assert set(small.tolist()) < set(large.tolist())
    two, four = scarce_subset(LABELS, 1.0, 2, seed=7), scarce_subset(LABELS, 1.0, 4, seed=7)
    kept4 = set(_counts(four))
    assert {i for i in four.tolist()} >= {i for i in two.tolist() if int(LABELS[i]) in kept4}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(labels=LABELS.float()), "integers"),
        (dict(labels=LABELS[None]), "1-D"),
        (dict(labels=LABELS, class_fraction=0.0), "class_fraction"),
        (dict(labels=LABELS, class_fraction=1.5), "class_fraction"),
        (dict(labels=LABELS, images_per_class=0), "images_per_class"),
        (dict(labels=LABELS, images_per_class=10), "only 1 classes have >= 10 images"),
    ],
)
def test_bad_input_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        scarce_subset(**kwargs)


def test_batch_fits_the_subset():
    assert scarce_batch(100, 20, num_classes=2, images_per_class=2) == (4, 2)
    assert scarce_batch(100, 20, num_classes=50, images_per_class=4) == (100, 4)
    assert scarce_batch(100, 20, num_classes=5, images_per_class=None) == (100, 20)


def test_mnist_datamodule_trains_on_the_subset_and_tests_on_everything():
    full = MNISTDemoDataModule(seed=3)
    full.setup("fit")
    dm = MNISTDemoDataModule(seed=3, class_fraction=0.4, images_per_class=2)
    dm.setup("fit")
    train = dm.datasets["train"]
    counts = Counter(train.labels.tolist())
    assert len(counts) == 2 and set(counts.values()) == {2} and set(counts) <= {0, 1, 2, 3, 4}
    assert len(dm.datasets["test"]) == len(full.datasets["test"]) == 2500
    # the subset's items are the base dataset's items
    for i in range(len(train)):
        x, y, _ = train[i]
        base = full.datasets["train"][int(train.rows[i])]
        assert torch.equal(x, base[0]) and y == base[1]
    (batch,) = list(dm.train_dataloader())[:1]
    assert batch[0].shape[0] == 4 and Counter(batch[1].tolist()) == counts
    with pytest.raises(ValueError, match="class_fraction"):
        MNISTDemoDataModule(class_fraction=0.0)


def test_subset_applies_to_the_training_part_of_a_validation_split():
    dm = MNISTDemoDataModule(seed=0, val_split=0.4, images_per_class=4)
    dm.setup("fit")
    train_classes = set(dm.datasets["train"].labels.tolist())
    val_classes = set(dm.datasets["val"].labels.tolist())
    assert len(train_classes) == 3 and len(val_classes) == 2 and not train_classes & val_classes
    assert len(dm.datasets["train"]) == 12
    _, labels = load_mnist_5k()  # the validation part keeps every image of its classes
    assert len(dm.datasets["val"]) == int(np.isin(labels, list(val_classes)).sum())
