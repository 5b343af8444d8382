"""On-disk layouts of the distractor-query tasks -> a :class:`DistractorTask`.

Four tasks of the gSAP paper (§C.4) have queries with no match in the database
(*distractor queries*): DISC21 (copy detection), the Met (artwork recognition),
ILIAS (instance retrieval with YFCC100M distractors) and WildlifeReID-10k
(re-identification with unknown individuals). Each reader checks the files it
needs and raises ``FileNotFoundError`` naming the missing path and the expected
layout (``docs/distractor_tasks.md`` gives conversions).

Label convention of a task: database items carry integer labels >= 0; a query
carries the label of the items it matches, or :data:`NO_MATCH` (-1) when it is a
distractor query; background items (query-side score normalisation) carry
:data:`BACKGROUND` (-2) and never match anything.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from rl_gap.data.ml_layouts import (
    IMAGE_EXTENSIONS,
    ImageList,
    read_folder_or_csv,
    require_dir,
    require_file,
)

NO_MATCH = -1
BACKGROUND = -2

DISC21_LAYOUT = """DISC21 (Douze et al. 2021), with the folder names of its public evaluation code:
  <root>/training/T<number>.jpg        training images (each its own instance; also the
                                       score-normalisation background)
  <root>/val_ref/R<number>.jpg         reference (database) images
  <root>/val_query/Q<number>.jpg       query images; most have no reference
  <root>/val_groundtruth_matches.csv   header 'query_id,reference_id', ids = file stems
                                       (Q00012,R000345); a query absent from the file, or
                                       with an empty reference_id, is a distractor query
  Other folder/file names: query_dir, reference_dir, train_dir, ground_truth."""

MET_LAYOUT = """The Met dataset (Ypsilantis et al. 2021), as distributed:
  <root>/images/MET/<met_id>/<image>.jpg       exhibit images (training set = database)
  <root>/images/test_met|test_other|test_noart/<image>.jpg   (val_* for the val split)
  <root>/ground_truth/MET_database.json        [{"id": <met_id>, "path": "MET/<met_id>/<image>.jpg"}, ...]
  <root>/ground_truth/testset.json (valset.json) [{"path": "test_met/<image>.jpg", "MET_id": <met_id>},
                                                 {"path": "test_other/<image>.jpg"}, ...]
  A query without "MET_id" (test_other, test_noart) is a distractor query."""

ILIAS_LAYOUT = """ILIAS (Kordopatis-Zilos et al. 2025) as one folder per instance:
  <root>/core/<instance_id>/query/<image>.jpg   query images of the instance
  <root>/core/<instance_id>/pos/<image>.jpg     its positive (database) images
  <root>/distractors/**/<image>.jpg             database distractors (YFCC100M images)
  <root>/distractor_queries/**/<image>.jpg      simulated distractor queries (optional;
                                                YFCC100M images absent from the database)
  Training images: the 'train' argument, a <class>/<image> folder or a 'path,label' CSV."""

WILDLIFE_LAYOUT = """WildlifeReID-10k (Adam et al. 2025), as distributed:
  <root>/metadata.csv   a header naming at least 'path', 'identity' and 'split' columns
                        (other columns such as 'dataset', 'species' are ignored)
  <root>/<path>         the image files
  split 'train' = training set = database; split 'test' = queries. A test image whose
  identity is empty, 'unknown', or absent from the train split is a distractor query."""


@dataclass
class DistractorTask:
    """Images of a distractor-query task.

    Attributes:
        train: training images with class labels.
        queries: query images; label = matched database label or ``NO_MATCH``.
        database: database images, labels >= 0.
        background: images for query-side score normalisation (None: none).
    """

    train: ImageList
    queries: ImageList
    database: ImageList
    background: ImageList | None = None

    @property
    def num_distractor_queries(self) -> int:
        return sum(1 for y in self.queries.labels if y == NO_MATCH)


def image_files(folder: Path, what: str, layout: str) -> list[Path]:
    """Image files under ``folder`` (recursive, sorted); a missing or empty folder raises."""
    require_dir(folder, what, layout)
    files = sorted(
        p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()
    )
    if not files:
        raise FileNotFoundError(f"{what} directory has no images: {folder}\nExpected {layout}")
    return files


def _by_stem(files: list[Path], what: str) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in files:
        if path.stem in out:
            raise ValueError(f"{what}: two images named {path.stem}: {out[path.stem]}, {path}")
        out[path.stem] = path
    return out


def read_disc21(
    root: str | Path,
    query_dir: str = "val_query",
    reference_dir: str = "val_ref",
    train_dir: str = "training",
    ground_truth: str = "val_groundtruth_matches.csv",
) -> DistractorTask:
    """DISC21: every training image its own class; references labelled 0..R-1; a query
    labelled with its reference, or ``NO_MATCH``; background = the training images."""
    root = require_dir(Path(root).expanduser(), "DISC21 root", DISC21_LAYOUT)
    gt_path = require_file(root / ground_truth, "DISC21 ground truth", DISC21_LAYOUT)
    references = _by_stem(
        image_files(root / reference_dir, "DISC21 references", DISC21_LAYOUT), "references"
    )
    queries = _by_stem(image_files(root / query_dir, "DISC21 queries", DISC21_LAYOUT), "queries")
    train = image_files(root / train_dir, "DISC21 training", DISC21_LAYOUT)
    ref_label = {stem: i for i, stem in enumerate(references)}
    match: dict[str, int] = {}
    with gt_path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        names = [n.strip().lower() for n in reader.fieldnames or []]
        if not {"query_id", "reference_id"} <= set(names):
            raise ValueError(
                f"{gt_path}: header must name 'query_id' and 'reference_id', got "
                f"{reader.fieldnames}\nExpected {DISC21_LAYOUT}"
            )
        reader.fieldnames = names
        for line_no, row in enumerate(reader, start=2):
            q, r = (row["query_id"] or "").strip(), (row["reference_id"] or "").strip()
            if not q:
                continue
            if q not in queries:
                raise ValueError(f"{gt_path}:{line_no}: query {q!r} has no image in {query_dir}/")
            if not r:
                continue
            if r not in ref_label:
                raise ValueError(
                    f"{gt_path}:{line_no}: reference {r!r} has no image in {reference_dir}/"
                )
            if q in match and match[q] != ref_label[r]:
                raise ValueError(
                    f"{gt_path}:{line_no}: query {q!r} matched to two references; DISC21 "
                    "queries have at most one"
                )
            match[q] = ref_label[r]
    query_list = ImageList(list(queries.values()), [match.get(q, NO_MATCH) for q in queries])
    database = ImageList(list(references.values()), list(ref_label.values()))
    train_list = ImageList(train, list(range(len(train))))
    return DistractorTask(train_list, query_list, database, train_list)


def _load_json_list(path: Path, layout: str) -> list[dict]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}\nExpected {layout}") from error
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        raise ValueError(f"{path} must hold a JSON list of objects\nExpected {layout}")
    if not data:
        raise ValueError(f"{path} lists no image\nExpected {layout}")
    return data


def read_met(root: str | Path, split: str = "test") -> DistractorTask:
    """The Met: database = training = MET exhibit images (label = ``id``), queries of
    ``split`` ("test"/"val") labelled ``MET_id`` or ``NO_MATCH``."""
    if split not in ("test", "val"):
        raise ValueError(f"Met query split must be 'test' or 'val', got {split!r}")
    root = require_dir(Path(root).expanduser(), "Met root", MET_LAYOUT)
    images = require_dir(root / "images", "Met images", MET_LAYOUT)
    db_json = require_file(root / "ground_truth" / "MET_database.json", "Met database", MET_LAYOUT)
    q_json = require_file(
        root / "ground_truth" / f"{split}set.json", f"Met {split} queries", MET_LAYOUT
    )
    db_paths, db_labels = [], []
    for i, entry in enumerate(_load_json_list(db_json, MET_LAYOUT)):
        if "path" not in entry or "id" not in entry:
            raise ValueError(f"{db_json}: entry {i} lacks 'path' or 'id': {entry}")
        db_paths.append(images / entry["path"])
        db_labels.append(int(entry["id"]))
    if min(db_labels) < 0:
        raise ValueError(f"{db_json}: exhibit ids must be >= 0, got {min(db_labels)}")
    q_paths, q_labels = [], []
    for i, entry in enumerate(_load_json_list(q_json, MET_LAYOUT)):
        if "path" not in entry:
            raise ValueError(f"{q_json}: entry {i} lacks 'path': {entry}")
        q_paths.append(images / entry["path"])
        q_labels.append(int(entry["MET_id"]) if entry.get("MET_id") is not None else NO_MATCH)
    database = ImageList(db_paths, db_labels)
    return DistractorTask(database, ImageList(q_paths, q_labels), database)


def read_ilias(root: str | Path, train: str | Path) -> DistractorTask:
    """ILIAS: instance i's queries and positives labelled i; distractors in the database
    labelled above every instance (one label each: they match nothing); distractor
    queries ``NO_MATCH``."""
    root = require_dir(Path(root).expanduser(), "ILIAS root", ILIAS_LAYOUT)
    core = require_dir(root / "core", "ILIAS core", ILIAS_LAYOUT)
    instances = sorted(p for p in core.iterdir() if p.is_dir())
    if not instances:
        raise FileNotFoundError(
            f"ILIAS core has no instance folder: {core}\nExpected {ILIAS_LAYOUT}"
        )
    q_paths, q_labels, db_paths, db_labels = [], [], [], []
    for label, folder in enumerate(instances):
        queries = image_files(folder / "query", f"ILIAS {folder.name} query", ILIAS_LAYOUT)
        positives = image_files(folder / "pos", f"ILIAS {folder.name} positives", ILIAS_LAYOUT)
        q_paths += queries
        q_labels += [label] * len(queries)
        db_paths += positives
        db_labels += [label] * len(positives)
    distractors = image_files(root / "distractors", "ILIAS distractors", ILIAS_LAYOUT)
    db_paths += distractors
    db_labels += range(len(instances), len(instances) + len(distractors))
    if (root / "distractor_queries").exists():
        extra = image_files(root / "distractor_queries", "ILIAS distractor queries", ILIAS_LAYOUT)
        q_paths += extra
        q_labels += [NO_MATCH] * len(extra)
    train_list = read_folder_or_csv(train)
    return DistractorTask(train_list, ImageList(q_paths, q_labels), ImageList(db_paths, db_labels))


def read_wildlife(root: str | Path, metadata: str = "metadata.csv") -> DistractorTask:
    """WildlifeReID-10k: identities of the train split labelled 0..K-1 (train = database);
    test images of those identities are queries with that label, the others ``NO_MATCH``."""
    root = require_dir(Path(root).expanduser(), "WildlifeReID-10k root", WILDLIFE_LAYOUT)
    meta = require_file(root / metadata, "WildlifeReID-10k metadata", WILDLIFE_LAYOUT)
    with meta.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        names = [n.strip().lower() for n in reader.fieldnames or []]
        if not {"path", "identity", "split"} <= set(names):
            raise ValueError(
                f"{meta}: header must name 'path', 'identity' and 'split', got "
                f"{reader.fieldnames}\nExpected {WILDLIFE_LAYOUT}"
            )
        reader.fieldnames = names
        rows = [{k: (v or "").strip() for k, v in r.items() if k} for r in reader]
    rows = [r for r in rows if any(r.values())]
    unknown = {"", "unknown", "nan", "none", "-1"}
    splits = {r["split"].lower() for r in rows}
    if not {"train", "test"} <= splits:
        raise ValueError(
            f"{meta}: the 'split' column must hold 'train' and 'test' rows, got {sorted(splits)}"
            f"\nExpected {WILDLIFE_LAYOUT}"
        )
    train_rows = [r for r in rows if r["split"].lower() == "train"]
    bad = [r["path"] for r in train_rows if r["identity"].lower() in unknown]
    if bad:
        raise ValueError(f"{meta}: train images need an identity; e.g. {bad[0]} has none")
    label_of = {name: i for i, name in enumerate(sorted({r["identity"] for r in train_rows}))}
    train = ImageList(
        [root / r["path"] for r in train_rows], [label_of[r["identity"]] for r in train_rows]
    )
    test_rows = [r for r in rows if r["split"].lower() == "test"]
    queries = ImageList(
        [root / r["path"] for r in test_rows],
        [label_of.get(r["identity"], NO_MATCH) for r in test_rows],
    )
    return DistractorTask(train, queries, train)
