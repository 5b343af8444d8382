"""Zero-shot classification sets: a folder per class, class names, prompt templates.

Layout: ``root/<class folder>/<image>.{jpg,jpeg,png,...}`` (torchvision's
``ImageFolder``); classes are the sorted folder names. Class names default to
the folder names with ``_`` read as spaces, or come from ``"imagenet"``
(open_clip's cleaned ImageNet-1k names, for ``n01440764/``-style folders), a list, a text file
(one name per line, in sorted-folder order) or a JSON object mapping folder
to name. Templates are a named set (``"openai_imagenet"``: CLIP's 80 ImageNet
prompts, ``"simple"``: open_clip's short set, ``"identity"``: the bare class
name) or a list of strings with a ``{}`` placeholder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rl_gap.data.image_text_sets import ZERO_SHOT, EvalImages, Transform

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm", ".tif", ".tiff")


def template_set(spec: str | Sequence[str]) -> list[str | Callable[[str], str]]:
    """Prompt templates from a set name or an explicit list of ``{}`` strings."""
    from open_clip import zero_shot_metadata as meta

    if isinstance(spec, str):
        named = {
            "openai_imagenet": list(meta.OPENAI_IMAGENET_TEMPLATES),
            "simple": list(meta.SIMPLE_IMAGENET_TEMPLATES),
            "identity": ["{}"],
        }
        if spec not in named:
            raise ValueError(
                f"unknown template set {spec!r}; known: {sorted(named)} (or give a list of "
                "strings with a '{{}}' placeholder)"
            )
        return named[spec]
    templates = list(spec)
    if not templates:
        raise ValueError("the template list is empty")
    bad = [t for t in templates if not callable(t) and "{}" not in t and "{c}" not in t]
    if bad:
        raise ValueError(f"template(s) without a '{{}}' placeholder: {bad}")
    return templates


def resolve_classnames(
    folders: Sequence[str], classnames: str | os.PathLike | Sequence[str] | dict | None
) -> list[str]:
    """Readable class names for the sorted class folders (see module doc)."""
    if classnames is None:
        return [f.replace("_", " ") for f in folders]
    if classnames == "imagenet":
        from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

        classnames = list(IMAGENET_CLASSNAMES)  # in sorted-WordNet-id folder order
    if isinstance(classnames, dict):
        mapping = classnames
    elif isinstance(classnames, str | os.PathLike):
        path = Path(classnames)
        if not path.is_file():
            raise FileNotFoundError(f"class-name file not found: {path}")
        if path.suffix == ".json":
            with open(path, encoding="utf-8") as f:
                mapping = json.load(f)
            if isinstance(mapping, list):
                classnames = mapping
                mapping = None
        else:
            classnames = [line.strip() for line in path.read_text("utf-8").splitlines()]
            classnames = [c for c in classnames if c]
            mapping = None
        if mapping is not None and not isinstance(mapping, dict):
            raise ValueError(f"{path} must hold a list of names or a folder->name object")
    else:
        mapping = None
    if mapping is not None:
        missing = [f for f in folders if f not in mapping]
        if missing:
            raise ValueError(f"class-name mapping lacks folder(s) {missing[:5]}")
        return [str(mapping[f]) for f in folders]
    names = [str(c) for c in classnames]
    if len(names) != len(folders):
        raise ValueError(
            f"{len(names)} class names for {len(folders)} class folders (names must follow "
            "the sorted folder order)"
        )
    return names


class ZeroShotImages(EvalImages):
    """Images of a zero-shot classification set with their class (``labels``), the class
    names and the prompt templates; items ``{"image": tensor, "label": int, "index": int}``."""

    eval_role = ZERO_SHOT
    key = "label"
    classnames: list[str]
    templates: list[str | Callable[[str], str]]

    @property
    def labels(self) -> list[int]:
        return self.values


class FolderClassification(ZeroShotImages):
    """Images of a folder-per-class dataset for zero-shot classification.

    Args:
        root: directory with one sub-folder per class.
        transform: PIL image -> (3, H, W) tensor.
        classnames: see ``resolve_classnames``.
        templates: see ``template_set``.
        name: the name metrics are logged under.

    Items: ``{"image": tensor, "label": int, "index": int}``.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        transform: Transform | None = None,
        classnames: str | os.PathLike | Sequence[str] | dict | None = None,
        templates: str | Sequence[str] = "openai_imagenet",
        name: str = "zero_shot",
    ) -> None:
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(
                f"zero-shot dataset folder not found: {root} (expected root/<class>/<image>)"
            )
        folders = sorted(d.name for d in root.iterdir() if d.is_dir())
        if not folders:
            raise ValueError(f"{root} has no class sub-folders (expected root/<class>/<image>)")
        self.samples: list[tuple[str, int]] = []
        for label, folder in enumerate(folders):
            files = sorted(
                p for p in (root / folder).rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS
            )
            self.samples.extend((str(p), label) for p in files)
        if not self.samples:
            raise ValueError(f"no images with extensions {IMAGE_EXTENSIONS} under {root}")
        paths, labels = zip(*self.samples)
        super().__init__(paths, labels, transform, name)
        self.folders = folders
        self.classnames = resolve_classnames(folders, classnames)
        self.templates = template_set(templates)


class InMemoryClassification(ZeroShotImages):
    """A zero-shot set from in-memory images (the glyph demo's held-out characters)."""

    def __init__(
        self,
        images: Sequence[Any],
        labels: Sequence[int],
        classnames: Sequence[str],
        templates: str | Sequence[str] = "identity",
        transform: Transform | None = None,
        name: str = "zero_shot",
    ) -> None:
        super().__init__(images, labels, transform, name)
        if min(self.labels) < 0 or max(self.labels) >= len(classnames):
            raise ValueError(f"labels must lie in [0, {len(classnames)}), got {min(self.labels)}..")
        self.classnames, self.templates = list(classnames), template_set(templates)
