"""Distractor-task data modules: query / database / background roles, missing background."""

from __future__ import annotations

import pytest
import torch

from rl_gap.data.distractor_sets import DISC21DataModule, WildlifeReIDDataModule
from rl_gap.metrics.distractor import ROLE_BACKGROUND, ROLE_DATABASE, ROLE_QUERY
from tests.data.test_distractor_layouts import make_disc21, make_wildlife


def test_datamodule_roles_and_background(tmp_path):
    root = make_disc21(tmp_path)
    common = dict(root=str(root), image_size=8, num_workers=0, batch_size=4, m_per_class=2)
    dm = DISC21DataModule(score_norm=True, background_size=3, **common)
    dm.setup("fit")
    test = dm.datasets["test"]
    roles = dm.evaluation_roles("test")
    assert roles.tolist() == [ROLE_QUERY] * 6 + [ROLE_DATABASE] * 4 + [ROLE_BACKGROUND] * 3
    assert dm.evaluation_roles("val") is roles  # validation is the task (val_split 0)
    assert test.labels.tolist()[:10] == [2, 0, -1, -1, 2, -1, 0, 1, 2, 3]
    background = [p.name for p in test.paths[10:]]
    assert len(set(background)) == 3 and all(n.startswith("T") for n in background)
    again = DISC21DataModule(score_norm=True, background_size=3, **common)
    again.setup("test")
    assert [p.name for p in again.datasets["test"].paths[10:]] == background  # seeded
    plain = DISC21DataModule(**common)
    plain.setup("test")
    assert len(plain.datasets["test"]) == 10 and plain.score_norm is None
    x, y, i = test[0]
    assert x.shape == (3, 8, 8) and y == 2 and i == 0
    assert len(dm.datasets["train"]) == 6 and len(torch.unique(dm.datasets["train"].labels)) == 6


def test_datamodule_without_background_explains(tmp_path):
    dm = WildlifeReIDDataModule(
        root=str(make_wildlife(tmp_path)), score_norm=True, image_size=8, num_workers=0
    )
    with pytest.raises(ValueError, match="background"):
        dm.setup("test")
    with pytest.raises(ValueError, match="queries_per_class"):
        WildlifeReIDDataModule(root=str(tmp_path), queries_per_class=4)
