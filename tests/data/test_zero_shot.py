"""Zero-shot sets: folder-per-class images, class names, prompt templates."""

from __future__ import annotations

import json

import pytest
from torchvision.transforms.functional import to_tensor

from rl_gap.data.zero_shot import FolderClassification, resolve_classnames, template_set
from tests.data.test_image_text_sets import red_value, write_images


def test_folder_classification_names_and_templates(tmp_path):
    write_images(tmp_path / "zs" / "golden_retriever", [("1.png", 1), ("2.jpg", 2)])
    write_images(tmp_path / "zs" / "cat", [("1.png", 3)])
    ds = FolderClassification(tmp_path / "zs", to_tensor, templates=["a photo of a {}."])
    assert ds.classnames == ["cat", "golden retriever"]
    assert [ds[i]["label"] for i in range(3)] == [0, 1, 1]
    assert red_value(ds[0]["image"]) == 3
    named = FolderClassification(tmp_path / "zs", to_tensor, classnames=["kitty", "dog"])
    assert named.classnames == ["kitty", "dog"] and len(named.templates) == 80
    (tmp_path / "names.json").write_text(json.dumps({"cat": "tabby", "golden_retriever": "dog"}))
    assert resolve_classnames(["cat", "golden_retriever"], str(tmp_path / "names.json")) == [
        "tabby",
        "dog",
    ]
    assert len(resolve_classnames([f"n{i}" for i in range(1000)], "imagenet")) == 1000
    with pytest.raises(ValueError, match="2 class folders"):
        resolve_classnames(["a", "b"], ["only one"])
    with pytest.raises(ValueError, match="unknown template set"):
        template_set("fancy")
    with pytest.raises(FileNotFoundError, match="root/<class>/<image>"):
        FolderClassification(tmp_path / "missing")


def test_in_memory_sets_give_one_value_per_image_under_their_key():
    import torch

    from rl_gap.data.image_text_sets import RetrievalImages
    from rl_gap.data.zero_shot import InMemoryClassification

    images = [torch.full((3, 2, 2), float(v)) for v in (5, 6, 7)]
    zs = InMemoryClassification(images, [1, 0, 1], ["a", "b"], name="toy")
    assert [(float(it["image"][0, 0, 0]), it["label"], it["index"]) for it in zs] == [
        (5.0, 1, 0), (6.0, 0, 1), (7.0, 1, 2),
    ]  # fmt: skip
    assert zs.labels == [1, 0, 1] and zs.eval_name == "toy" and "group" not in zs[0]
    ri = RetrievalImages(images, [9, 9, 4])
    assert [(it["group"], it["index"]) for it in ri] == [(9, 0), (9, 1), (4, 2)]
    assert ri.groups == [9, 9, 4] and "label" not in ri[0]
    with pytest.raises(ValueError, match="InMemoryClassification needs one label per image"):
        InMemoryClassification(images, [0, 1], ["a", "b"])
    with pytest.raises(ValueError, match="RetrievalImages needs one group per image"):
        RetrievalImages([], [])
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        InMemoryClassification(images, [0, 1, 2], ["a", "b"])
