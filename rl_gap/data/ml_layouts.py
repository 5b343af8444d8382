"""Readers for the on-disk layouts of metric-learning datasets -> (image paths, labels).

Every reader checks the files it needs and raises ``FileNotFoundError``
naming the missing path *and the expected layout*. Class-disjoint train/test
splits follow the literature (Song et al. 2016 for SOP and CUB; Brown et al.
2020, Smooth-AP, for iNaturalist 2018).
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")

SOP_LAYOUT = """Stanford Online Products (Song et al. 2016), as distributed:
  <root>/Ebay_train.txt   header 'image_id class_id super_class_id path', 59,551 rows (classes 1-11318)
  <root>/Ebay_test.txt    same header, 60,502 rows (classes 11319-22634)
  <root>/<path>           e.g. bicycle_final/111085122871_0.JPG"""

INAT_LAYOUT = """iNaturalist 2018 with the metric-learning class splits of Smooth-AP (Brown et al. 2020):
  <root>/Inaturalist_train_set1.txt   one image path per line (325,846 lines, 5,690 classes)
  <root>/Inaturalist_test_set1.txt    one image path per line (136,093 lines, 2,452 classes)
  <root>/train_val2018/<kingdom>/<class_id>/<image>.jpg
  A line is 'path' (label = the image's parent folder) or 'path label'."""

CUB_LAYOUT = """CUB-200-2011 (Wah et al. 2011), as distributed:
  <root>/images.txt               '<image_id> <relative path>'
  <root>/image_class_labels.txt   '<image_id> <class_id 1..200>'
  <root>/images/<class folder>/<image>.jpg
  Train on classes 1-100, test on classes 101-200."""

FOLDER_LAYOUT = """a generic image folder or CSV:
  folder: <split>/<class name>/<image>.{jpg,png,...}  (one sub-folder per class)
  CSV:    a file with a header row containing 'path' and 'label' columns;
          relative paths are resolved against the CSV's folder."""


@dataclass
class ImageList:
    """Image files and their integer class labels (same length)."""

    paths: list[Path]
    labels: list[int]

    def __post_init__(self) -> None:
        if len(self.paths) != len(self.labels):
            raise ValueError(f"{len(self.paths)} paths but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.paths)


def open_rgb(path: str | Path):
    """Read an image file as an RGB PIL image; a corrupt or truncated file raises an
    ``OSError`` naming the path (PIL's own message does not)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return image.convert("RGB")  # decodes the whole file: truncation shows here
    except FileNotFoundError:
        raise
    except (OSError, SyntaxError, ValueError) as error:
        raise OSError(f"cannot read image {path}: {error}") from error


def missing_files(paths: list[Path]) -> list[Path]:
    """The listed files that do not exist (one ``os.path.exists`` each: fast, no decoding)."""
    return [p for p in paths if not os.path.exists(p)]


def require_file(path: Path, what: str, layout: str) -> Path:
    """Return ``path`` if it is a file, else raise naming it and the expected layout."""
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}\nExpected {layout}")
    return path


def require_dir(path: Path, what: str, layout: str) -> Path:
    if not path.is_dir():
        raise FileNotFoundError(f"{what} directory not found: {path}\nExpected {layout}")
    return path


def _non_empty(items: ImageList, source: Path, layout: str) -> ImageList:
    if len(items) == 0:
        raise ValueError(f"no images listed in {source}\nExpected {layout}")
    return items


def read_sop(root: str | Path, split: str) -> ImageList:
    """Stanford Online Products ``split`` in {"train", "test"} (class-disjoint by construction)."""
    root = require_dir(Path(root).expanduser(), "SOP root", SOP_LAYOUT)
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    listing = require_file(root / f"Ebay_{split}.txt", f"SOP {split} list", SOP_LAYOUT)
    paths, labels = [], []
    with listing.open() as f:
        header = f.readline().split()
        if header[:4] != ["image_id", "class_id", "super_class_id", "path"]:
            raise ValueError(f"unexpected header {header} in {listing}\nExpected {SOP_LAYOUT}")
        for line_no, line in enumerate(f, start=2):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 4:
                raise ValueError(f"{listing}:{line_no}: expected 4 fields, got {line!r}")
            labels.append(int(fields[1]))
            paths.append(root / fields[3])
    return _non_empty(ImageList(paths, labels), listing, SOP_LAYOUT)


def read_inat(root: str | Path, split: str, list_file: str | Path | None = None) -> ImageList:
    """iNaturalist 2018 metric-learning split ("train"/"test") from a list of image paths.

    Labels are the class folder (``.../<class_id>/<image>.jpg``) unless a line
    carries an explicit second field.
    """
    root = require_dir(Path(root).expanduser(), "iNaturalist root", INAT_LAYOUT)
    if list_file is None:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        list_file = root / f"Inaturalist_{split}_set1.txt"
    listing = require_file(Path(list_file), f"iNaturalist {split} list", INAT_LAYOUT)
    paths, names = [], []
    with listing.open() as f:
        for line_no, line in enumerate(f, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) > 2:
                raise ValueError(f"{listing}:{line_no}: expected 'path [label]', got {line!r}")
            path = Path(fields[0])
            paths.append(path if path.is_absolute() else root / path)
            names.append(fields[1] if len(fields) == 2 else path.parent.name)
    return _non_empty(ImageList(paths, _integer_labels(names)), listing, INAT_LAYOUT)


def read_cub(root: str | Path, split: str) -> ImageList:
    """CUB-200-2011: "train" = classes 1-100, "test" = classes 101-200."""
    root = require_dir(Path(root).expanduser(), "CUB-200-2011 root", CUB_LAYOUT)
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    images = require_file(root / "images.txt", "CUB image list", CUB_LAYOUT)
    classes = require_file(root / "image_class_labels.txt", "CUB class labels", CUB_LAYOUT)
    label_of = {}
    for line in classes.read_text().splitlines():
        if line.strip():
            image_id, label = line.split()
            label_of[image_id] = int(label)
    paths, labels = [], []
    for line in images.read_text().splitlines():
        if not line.strip():
            continue
        image_id, rel = line.split(maxsplit=1)
        if image_id not in label_of:
            raise ValueError(f"image id {image_id} of {images} has no label in {classes}")
        label = label_of[image_id]
        if (label <= 100) == (split == "train"):
            paths.append(root / "images" / rel)
            labels.append(label)
    return _non_empty(ImageList(paths, labels), images, CUB_LAYOUT)


def read_folder_or_csv(source: str | Path) -> ImageList:
    """A ``<class>/<image>`` folder tree or a CSV with ``path`` and ``label`` columns."""
    source = Path(source).expanduser()
    if source.is_file():
        return _read_csv(source)
    require_dir(source, "image folder", FOLDER_LAYOUT)
    paths, names = [], []
    for class_dir in sorted(p for p in source.iterdir() if p.is_dir()):
        for image in sorted(class_dir.rglob("*")):
            if image.suffix.lower() in IMAGE_EXTENSIONS and image.is_file():
                paths.append(image)
                names.append(class_dir.name)
    return _non_empty(ImageList(paths, _integer_labels(names)), source, FOLDER_LAYOUT)


def _read_csv(source: Path) -> ImageList:
    with source.open(newline="", encoding="utf-8-sig") as f:  # utf-8-sig: Excel's BOM
        reader = csv.DictReader(f)
        # The header names the columns in any case/spacing ("Path, Label").
        reader.fieldnames = [name.strip().lower() for name in reader.fieldnames or []]
        if not {"path", "label"} <= set(reader.fieldnames):
            raise ValueError(
                f"{source}: the first row must be a header naming the 'path' and 'label' "
                f"columns, got {reader.fieldnames}\nExpected {FOLDER_LAYOUT}"
            )
        rows = [r for r in reader if any((v or "").strip() for v in r.values())]
    for line_no, r in enumerate(rows, start=2):
        if not (r["path"] or "").strip() or not (r["label"] or "").strip():
            raise ValueError(f"{source}:{line_no}: empty 'path' or 'label' in {r}")
        r["path"], r["label"] = r["path"].strip(), r["label"].strip()
    paths = [
        Path(r["path"]) if Path(r["path"]).is_absolute() else source.parent / r["path"]
        for r in rows
    ]
    return _non_empty(
        ImageList(paths, _integer_labels([r["label"] for r in rows])), source, FOLDER_LAYOUT
    )


def _integer_labels(names: list[str]) -> list[int]:
    """Integer labels kept as numbers when every name is an integer and distinct names stay
    distinct (``1`` and ``01`` are two classes), else indices of the sorted names."""
    distinct = set(names)
    try:
        numbers = {n: int(n) for n in distinct}
    except ValueError:
        numbers = None
    if numbers is None or len(set(numbers.values())) != len(distinct):
        numbers = {n: i for i, n in enumerate(sorted(distinct))}
    return [numbers[n] for n in names]
