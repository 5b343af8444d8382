"""Class labels from user files, read exactly and encoded as shared integer codes.

- ``.npy`` / ``.pt``: (N,) integers (any width, read as int64), floats holding whole
  numbers, or fixed-width strings (``np.array(names, dtype=str)``);
- ``.txt`` / ``.csv``: one label per line (any text). Integer ids are parsed as
  int64, never through float64, so 64-bit ids such as ``2**60`` and ``2**60 + 1``
  stay distinct and match the same ids stored in an int64 ``.npy``.

Labels compare as numbers when both sides are numbers (``1.0`` equals ``1``), else
as exact class names. A float label beyond 2**53 is refused: float64 cannot tell
neighbouring ids apart there, so it could merge two classes silently.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from rl_gap.commands.npy_io import load_npy, load_pt

LABEL_LAYOUT = ".npy/.pt (N,) integers or .txt/.csv one label per line"
_HEADER_NAMES = ("label", "labels", "class", "class_id", "target")
_FLOAT_EXACT = 2**53  # float64 holds every integer up to here, and no longer all of them
_INT64 = np.iinfo(np.int64)


def load_labels(path: str | Path, count: int | None = None) -> np.ndarray:
    """Labels of ``path`` as a 1-D array (integers, floats, or strings from text files).

    ``count`` (the number of embeddings they label) settles whether a text file's
    first row is a header; see :func:`label_column`.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"missing label file {p}: expected {LABEL_LAYOUT}")
    if p.suffix == ".npy":
        return load_npy(p, mmap=False)
    if p.suffix == ".pt":
        obj = load_pt(p)
        if isinstance(obj, dict):
            obj = obj.get("labels")
        if not isinstance(obj, torch.Tensor):
            raise ValueError(f"{p}: no label tensor; expected {LABEL_LAYOUT}")
        return obj.numpy()
    if p.suffix in (".txt", ".csv"):
        rows = [line.strip() for line in p.read_text(encoding="utf-8-sig").splitlines()]
        return label_column(p, [[f.strip() for f in row.split(",")] for row in rows if row], count)
    raise ValueError(f"{p}: unknown label format {p.suffix!r}; expected {LABEL_LAYOUT}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def label_column(path: Path, rows: list[list[str]], count: int | None = None) -> np.ndarray:
    """One label per row of a text/CSV file, its header row (if any) recognised and dropped.

    A first row naming a column ``label``/``class``/``class_id``/``target`` is a header
    and that column holds the labels. A first row that is not a number above rows that
    all are is ambiguous: a header (``species``) or a class name among numeric ids.
    With ``count`` known, ``count + 1`` rows make it a header (dropped, said on stderr)
    and ``count`` rows a label (kept: the labels then compare as class names); without
    it, it is taken as a header and said so.
    """
    if not rows:
        raise ValueError(f"{path}: holds no labels")
    column, body = 0, rows
    names = [name.lower() for name in rows[0]]
    named = [i for i, name in enumerate(names) if name in _HEADER_NAMES]
    if named:
        column, body = named[0], rows[1:]
    elif not _is_number(rows[0][0]) and len(rows) > 1 and all(_is_number(r[0]) for r in rows[1:]):
        if count is None or len(rows) != count:
            body = rows[1:]
            print(
                f"{path}: first row {rows[0][0]!r} read as a header (the other {len(body)} rows "
                "are numbers" + ("" if count is None else f", one per embedding ({count})") + ")",
                file=sys.stderr,
            )
    short = [i for i, row in enumerate(body) if len(row) <= column]
    if short:
        raise ValueError(f"{path}: row {short[0] + 1 + (body is not rows)} has no column {column}")
    if not body:
        raise ValueError(f"{path}: holds a header but no labels")
    return np.asarray([row[column] for row in body])


def _text_numbers(text: np.ndarray) -> np.ndarray | None:
    """Numbers written in text labels, exactly: int64 when every entry is an integer
    literal, float64 when some are not; None when some entry is not a number (names)."""
    try:
        ints = [int(v) for v in text]
    except ValueError:
        ints = None
    if ints is not None:
        too_big = [v for v in ints if not _INT64.min <= v <= _INT64.max]
        if too_big:
            raise ValueError(
                f"label {too_big[0]} is outside the 64-bit integer range: write ids that "
                "large as class names (with a letter) on both sides"
            )
        return np.asarray(ints, dtype=np.int64)
    try:
        return np.asarray([float(v) for v in text], dtype=np.float64)
    except ValueError:
        return None


def _refuse_respellings(text: np.ndarray, values: np.ndarray) -> None:
    """ "01" and "1" (or "1" and "1.0") in one file would become one class: refuse."""
    _, value_code = np.unique(values, return_inverse=True)
    _, text_code = np.unique(text, return_inverse=True)
    pairs = np.unique(np.stack([value_code.ravel(), text_code.ravel()], axis=1), axis=0)
    spellings = np.bincount(pairs[:, 0])
    if (spellings > 1).any():
        value = int(np.flatnonzero(spellings > 1)[0])
        shown = sorted({str(t) for t in text[value_code.ravel() == value]})
        raise ValueError(
            f"labels {shown} are the same number but different text: write each class one way"
        )


def as_numbers(labels: np.ndarray) -> np.ndarray | None:
    """Numeric view of labels: integer arrays as int64, float arrays as they are, text
    when every entry is a number (integers exactly); None for class names."""
    if labels.dtype.kind == "u" and labels.size and labels.max() > _INT64.max:
        raise ValueError(f"label {labels.max()} does not fit in int64: store ids as int64")
    if labels.dtype.kind in "iub":
        return labels.astype(np.int64)
    if labels.dtype.kind == "f":
        return labels
    text = labels.astype(str)
    values = _text_numbers(text)
    if values is not None:
        _refuse_respellings(text, values)
    return values


def _integer_codes(values: np.ndarray, name: str) -> np.ndarray:
    if values.dtype.kind != "f":
        return values.astype(np.int64)
    bad = ~np.isfinite(values) | (values != np.round(values))
    if bad.any():
        raise ValueError(
            f"{name} must be integer class ids, got {values[bad][0]} (never truncated)"
        )
    inexact = np.abs(values) > _FLOAT_EXACT
    if inexact.any():
        raise ValueError(
            f"{name} hold the float {values[inexact][0]:.17g}, beyond 2**53 where float64 cannot "
            "tell neighbouring ids apart: store ids as integers (int64 .npy or digits in text)"
        )
    return values.astype(np.int64)


def encode_labels(
    query_labels: np.ndarray, database_labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Shared integer codes for both label arrays.

    Numbers compare as numbers whatever their storage (``1.0`` from a float array or
    a text file equals ``1``; integers exactly, 64 bits); text that is not all numbers
    compares as exact class names. Mixing names on one side with numbers on the other
    is refused, and so is a query set that shares no label with the database (every
    metric would be NaN).
    """
    if query_labels.ndim != 1 or database_labels.ndim != 1:
        raise ValueError(
            f"labels must be 1-D, got shapes {query_labels.shape} and {database_labels.shape}"
        )
    for side, labels in (("query", query_labels), ("database", database_labels)):
        if len(labels) == 0:
            raise ValueError(f"the {side} set is empty (0 labels)")
    q_num, d_num = as_numbers(query_labels), as_numbers(database_labels)
    if q_num is not None and d_num is not None:
        q_codes = _integer_codes(q_num, "query labels")
        d_codes = _integer_codes(d_num, "database labels")
    elif q_num is None and d_num is None:
        both = np.concatenate([query_labels.astype(str), database_labels.astype(str)])
        _, codes = np.unique(both, return_inverse=True)
        q_codes, d_codes = codes[: len(query_labels)], codes[len(query_labels) :]
    else:
        names, numbers = ("query", "database") if q_num is None else ("database", "query")
        raise ValueError(
            f"{names} labels are class names but {numbers} labels are numbers: "
            "give both in one form"
        )
    if not np.isin(q_codes, d_codes).any():
        raise ValueError(
            "no query label occurs among the database labels: every metric would be NaN "
            "(check that both label files use the same class ids)"
        )
    return q_codes, d_codes
