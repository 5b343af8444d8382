"""On-disk layouts of the distractor-query tasks (tiny fixtures written by the tests).

The ``make_*`` builders are imported by the other ``test_distractor_*`` files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rl_gap.data.distractor_layouts import (
    NO_MATCH,
    read_disc21,
    read_ilias,
    read_met,
    read_wildlife,
)


def write_image(path: Path, seed: int, size: int = 12) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def make_disc21(root: Path, num_train: int = 6) -> Path:
    """4 references, 6 queries (Q0->R2, Q1->R0, Q4->R2 matched; Q2 empty row, Q3/Q5 unlisted)."""
    for i in range(num_train):
        write_image(root / "training" / f"T{i:06d}.jpg", 100 + i)
    for i in range(4):
        write_image(root / "val_ref" / f"R{i:06d}.jpg", 200 + i)
    for i in range(6):
        write_image(root / "val_query" / f"Q{i:05d}.png", 300 + i)
    (root / "val_groundtruth_matches.csv").write_text(
        "query_id,reference_id\nQ00000,R000002\nQ00001,R000000\nQ00002,\nQ00004,R000002\n"
    )
    return root


def make_met(root: Path) -> Path:
    db = []
    for met_id, count in ((5, 2), (7, 1), (9, 3)):
        for k in range(count):
            rel = f"MET/{met_id}/{k}.jpg"
            write_image(root / "images" / rel, 10 * met_id + k)
            db.append({"id": met_id, "path": rel})
    queries = [
        {"path": "test_met/a.jpg", "MET_id": 9},
        {"path": "test_other/b.jpg"},
        {"path": "test_noart/c.jpg"},
        {"path": "test_met/d.jpg", "MET_id": 5},
    ]
    for i, q in enumerate(queries):
        write_image(root / "images" / q["path"], 500 + i)
    (root / "ground_truth").mkdir(parents=True)
    (root / "ground_truth" / "MET_database.json").write_text(json.dumps(db))
    (root / "ground_truth" / "testset.json").write_text(json.dumps(queries))
    return root


def make_ilias(root: Path) -> Path:
    for i, name in enumerate(("obj_a", "obj_b")):
        write_image(root / "core" / name / "query" / "q0.jpg", 600 + i)
        for k in range(2):
            write_image(root / "core" / name / "pos" / f"p{k}.jpg", 610 + 10 * i + k)
    for k in range(3):
        write_image(root / "distractors" / "yfcc" / f"d{k}.jpg", 700 + k)
    write_image(root / "distractor_queries" / "x0.jpg", 800)
    for c in range(2):
        for k in range(2):
            write_image(root / "train" / f"class{c}" / f"{k}.jpg", 900 + 2 * c + k)
    return root


def make_wildlife(root: Path) -> Path:
    rows = [
        ("images/lynx/a0.jpg", "lynx_a", "train"),
        ("images/lynx/a1.jpg", "lynx_a", "train"),
        ("images/lynx/b0.jpg", "lynx_b", "train"),
        ("images/lynx/b1.jpg", "lynx_b", "train"),
        ("images/lynx/a2.jpg", "lynx_a", "test"),
        ("images/lynx/c0.jpg", "lynx_c", "test"),  # a new individual: distractor query
        ("images/lynx/u0.jpg", "unknown", "test"),
        ("images/lynx/b2.jpg", "lynx_b", "test"),
    ]
    for i, (path, _, _) in enumerate(rows):
        write_image(root / path, 1000 + i)
    lines = ["image_id,identity,path,split,species"]
    lines += [f"{i},{ident},{path},{split},lynx" for i, (path, ident, split) in enumerate(rows)]
    (root / "metadata.csv").write_text("\n".join(lines) + "\n")
    return root


def test_disc21_layout(tmp_path):
    task = read_disc21(make_disc21(tmp_path))
    assert [p.name for p in task.queries.paths] == [f"Q{i:05d}.png" for i in range(6)]
    assert task.queries.labels == [2, 0, NO_MATCH, NO_MATCH, 2, NO_MATCH]
    assert task.database.labels == [0, 1, 2, 3]
    assert [p.stem for p in task.database.paths] == [f"R{i:06d}" for i in range(4)]
    assert task.train.labels == list(range(6))  # every training image its own instance
    assert task.background is task.train and task.num_distractor_queries == 3


def test_disc21_errors_name_the_layout(tmp_path):
    root = make_disc21(tmp_path / "d")
    (root / "val_groundtruth_matches.csv").unlink()
    with pytest.raises(FileNotFoundError, match="val_groundtruth_matches.csv") as info:
        read_disc21(root)
    assert "val_ref/R<number>.jpg" in str(info.value)
    (root / "val_groundtruth_matches.csv").write_text("query_id,reference_id\nQ00000,R000099\n")
    with pytest.raises(ValueError, match="R000099"):
        read_disc21(root)
    (root / "val_groundtruth_matches.csv").write_text("query,ref\nQ00000,R000001\n")
    with pytest.raises(ValueError, match="query_id"):
        read_disc21(root)
    with pytest.raises(FileNotFoundError, match="no_disc_here") as info:
        read_disc21(tmp_path / "no_disc_here")
    assert "val_query" in str(info.value)


def test_met_layout(tmp_path):
    task = read_met(make_met(tmp_path))
    assert task.database.labels == [5, 5, 7, 9, 9, 9] and task.train is task.database
    assert task.queries.labels == [9, NO_MATCH, NO_MATCH, 5]
    assert task.queries.paths[1] == tmp_path / "images" / "test_other" / "b.jpg"
    with pytest.raises(FileNotFoundError, match="valset.json") as info:
        read_met(tmp_path, "val")
    assert "MET_database.json" in str(info.value)


def test_ilias_layout(tmp_path):
    root = make_ilias(tmp_path)
    task = read_ilias(root, root / "train")
    assert task.queries.labels == [0, 1, NO_MATCH]
    assert task.database.labels[:4] == [0, 0, 1, 1]
    distractor_labels = task.database.labels[4:]
    assert len(distractor_labels) == 3 and len(set(distractor_labels)) == 3
    assert not set(distractor_labels) & set(task.queries.labels)  # they match no query
    assert sorted(set(task.train.labels)) == [0, 1] and len(task.train) == 4
    with pytest.raises(FileNotFoundError, match="distractors") as info:
        read_ilias(tmp_path / "missing", root / "train")
    assert "core/<instance_id>/query" in str(info.value)


def test_wildlife_layout(tmp_path):
    task = read_wildlife(make_wildlife(tmp_path))
    assert task.train.labels == [0, 0, 1, 1] and task.database is task.train
    assert task.queries.labels == [0, NO_MATCH, NO_MATCH, 1]
    (tmp_path / "metadata.csv").write_text("path,identity\nimages/lynx/a0.jpg,lynx_a\n")
    with pytest.raises(ValueError, match="'split'") as info:
        read_wildlife(tmp_path)
    assert "metadata.csv" in str(info.value)
    with pytest.raises(FileNotFoundError, match="metadata.csv"):
        read_wildlife(tmp_path / "nothing")
