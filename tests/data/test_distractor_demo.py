"""The MNIST distractor demo: queries of database digits have matches, queries of
distractor digits none; the database holds no query image; a seeded background."""

from __future__ import annotations

import pytest
import torch

from rl_gap.data.distractor_demo import MNISTDistractorDemoDataModule
from rl_gap.data.distractor_layouts import BACKGROUND, NO_MATCH
from rl_gap.metrics.distractor import ROLE_BACKGROUND, ROLE_DATABASE, ROLE_QUERY


def test_evaluation_split_roles_labels_and_disjoint_rows():
    dm = MNISTDistractorDemoDataModule(queries_per_digit=5, background_size=7, seed=3)
    test = dm.build_split("test", train=False)
    roles, labels = dm._roles, test.labels
    assert roles.tolist()[:25] == [ROLE_QUERY] * 25
    assert labels[:25].tolist() == sum(([d] * 5 for d in (5, 6, 7)), []) + [NO_MATCH] * 10
    database = labels[roles == ROLE_DATABASE]
    assert set(database.tolist()) == {5, 6, 7}
    assert (labels[roles == ROLE_BACKGROUND] == BACKGROUND).sum() == 7
    images = test.images.flatten(1)
    queries, db = images[roles == ROLE_QUERY], images[roles == ROLE_DATABASE]
    # no query image is also a database image (a self match would count as a positive)
    assert not (torch.cdist(queries, db) == 0).any()
    again = MNISTDistractorDemoDataModule(queries_per_digit=5, background_size=7, seed=3)
    assert torch.equal(again.build_split("test", train=False).images, test.images)


def test_training_split_holds_only_training_digits():
    dm = MNISTDistractorDemoDataModule(train_digits=(0, 1))
    assert set(dm.build_split("train", train=True).labels.tolist()) == {0, 1}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"database_digits": (4, 5)}, "must be disjoint"),
        ({"database_digits": ()}, "database_digits is empty"),
        ({"queries_per_digit": 0}, "queries_per_digit and background_size must be >= 1"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MNISTDistractorDemoDataModule(**kwargs)
