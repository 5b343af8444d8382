"""``rl-gap evaluate``: exact retrieval metrics from saved embeddings.

Inputs (memory-mapped where possible, never the Q x D matrix):

- embeddings: ``.npy`` (N, dim) float array (opened with ``mmap_mode="r"``) or
  ``.pt`` holding a tensor, or a dict with an ``"embeddings"`` tensor
  (loaded with ``mmap=True``);
- labels: ``.npy`` / ``.pt`` (N,) integers (or the ``"labels"`` entry of the
  embeddings' ``.pt`` dict), or ``.txt`` / ``.csv`` with one label per line
  (any strings; query and database labels share one vocabulary).

Example::

    rl-gap evaluate --queries q.npy --query-labels q_labels.txt \
        --database db.npy --database-labels db_labels.txt --output metrics.json
    rl-gap evaluate --queries all.npy --query-labels labels.npy   # leave-one-out

Without ``--database`` the queries are the database and evaluation is
leave-one-out (self pairs excluded; said on stderr). Labels compare as numbers
when both sides are numbers (``1.0`` equals ``1``), else as exact class names.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

from rl_gap.commands.npy_io import load_npy

_LAYOUT = (
    "expected .npy (N, dim) / .pt tensor or {'embeddings', 'labels'} dict for embeddings; "
    ".npy/.pt (N,) integers or .txt/.csv one label per line for labels"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queries", required=True, help="query embeddings (.npy or .pt)")
    parser.add_argument("--database", help="database embeddings; default: the queries")
    parser.add_argument("--query-labels", help="query labels (.npy/.pt/.txt/.csv)")
    parser.add_argument("--database-labels", help="database labels; default: query labels")
    parser.add_argument(
        "--exclude-self",
        action="store_true",
        help="leave-one-out: queries are the database (the default without --database; with "
        "--database, only when it is the --queries file)",
    )
    parser.add_argument("--block-size", type=int, default=2048, help="GEMM block rows/columns")
    parser.add_argument("--device", default="cpu", help="scoring device, e.g. cpu or cuda:0")
    parser.add_argument("--normalize", action="store_true", help="L2-normalise (cosine scores)")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 5, 10], help="R@k cut-offs")
    parser.add_argument("--map-at", type=int, nargs="*", default=[], help="mAP@k cut-offs")
    parser.add_argument("--precision", type=float, nargs="+", default=[0.9], help="R@P levels")
    parser.add_argument("--protocol", action="store_true", help="shared-threshold protocol")
    parser.add_argument("--bootstrap", type=int, default=0, help="bootstrap samples for CIs")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the consistency ceiling")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", help="write the metrics as JSON here")


def _require(path: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"missing file {p}: {_LAYOUT}")
    return p


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _load_pt(path: Path):
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except RuntimeError:  # not a zip-format checkpoint: no mmap
        return torch.load(path, map_location="cpu", weights_only=True)


def load_embeddings(path: str) -> tuple[np.ndarray | torch.Tensor, object | None]:
    """Embeddings (memory-mapped) and, for a ``.pt`` dict, its labels entry."""
    p = _require(path)
    if p.suffix == ".npy":
        return load_npy(p), None
    if p.suffix == ".pt":
        obj = _load_pt(p)
        if isinstance(obj, dict):
            if "embeddings" not in obj:
                raise ValueError(f"{p}: dict without an 'embeddings' entry; {_LAYOUT}")
            return obj["embeddings"], obj.get("labels")
        if isinstance(obj, torch.Tensor):
            return obj, None
        raise ValueError(f"{p}: holds {type(obj).__name__}; {_LAYOUT}")
    raise ValueError(f"{p}: unknown embeddings format {p.suffix!r}; {_LAYOUT}")


def load_labels(path: str) -> np.ndarray:
    """Labels as a 1-D array (integers, or strings from text files)."""
    p = _require(path)
    if p.suffix == ".npy":
        return load_npy(p, mmap=False)
    if p.suffix == ".pt":
        obj = _load_pt(p)
        if isinstance(obj, dict):
            obj = obj.get("labels")
        if not isinstance(obj, torch.Tensor):
            raise ValueError(f"{p}: no label tensor; {_LAYOUT}")
        return obj.numpy()
    if p.suffix in (".txt", ".csv"):
        rows = [line.strip() for line in p.read_text(encoding="utf-8-sig").splitlines()]
        return _label_column(p, [[f.strip() for f in row.split(",")] for row in rows if row])
    raise ValueError(f"{p}: unknown label format {p.suffix!r}; {_LAYOUT}")


_LABEL_HEADERS = ("label", "labels", "class", "class_id", "target")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _label_column(path: Path, rows: list[list[str]]) -> np.ndarray:
    """One label per row of a text/CSV file, its header row (if any) recognised and dropped.

    A first row naming a column ``label``/``class``/``class_id``/``target`` is a header and
    that column holds the labels; a non-numeric first field above rows that are all numbers
    is a header too (a header would otherwise be one more label, shifting every row by one).
    """
    if not rows:
        raise ValueError(f"{path}: holds no labels")
    column, body = 0, rows
    names = [name.lower() for name in rows[0]]
    named = [i for i, name in enumerate(names) if name in _LABEL_HEADERS]
    if named:
        column, body = named[0], rows[1:]
    elif not _is_number(rows[0][0]) and len(rows) > 1 and all(_is_number(r[0]) for r in rows[1:]):
        body = rows[1:]
    short = [i for i, row in enumerate(body) if len(row) <= column]
    if short:
        raise ValueError(f"{path}: row {short[0] + 1 + (body is not rows)} has no column {column}")
    if not body:
        raise ValueError(f"{path}: holds a header but no labels")
    return np.asarray([row[column] for row in body])


def _as_numbers(labels: np.ndarray) -> np.ndarray | None:
    """Numeric view of labels: numeric arrays as they are, text when every entry is a
    number ("1", "1.0"); None for text that is not all numbers (class names)."""
    if labels.dtype.kind in "iub":
        return labels.astype(np.int64)
    if labels.dtype.kind == "f":
        return labels
    try:
        values = np.asarray([float(v) for v in labels.astype(str)], dtype=np.float64)
    except ValueError:
        return None
    # "01" and "1" (or "1" and "1.0") in one file would become one class: refuse.
    text = labels.astype(str)
    for value in np.unique(values):
        spellings = np.unique(text[values == value])
        if len(spellings) > 1:
            raise ValueError(
                f"labels {list(spellings)} are the same number but different text: "
                "write each class one way"
            )
    return values


def _integer_codes(values: np.ndarray, name: str) -> np.ndarray:
    if values.dtype.kind == "f":
        if not np.isfinite(values).all() or not np.all(values == np.round(values)):
            bad = values[~np.isfinite(values) | (values != np.round(values))][0]
            raise ValueError(f"{name} must be integer class ids, got {bad} (never truncated)")
        return values.astype(np.int64)
    return values.astype(np.int64)


def _encode(query_labels: np.ndarray, database_labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shared integer codes for both label arrays.

    Numbers compare as numbers whatever their storage (``1.0`` from a float array or
    a text file equals ``1``); text that is not all numbers compares as exact class
    names. Mixing names on one side with numbers on the other is refused, and so is
    a query set that shares no label with the database (every metric would be NaN).
    """
    if query_labels.ndim != 1 or database_labels.ndim != 1:
        raise ValueError(
            f"labels must be 1-D, got shapes {query_labels.shape} and {database_labels.shape}"
        )
    for side, labels in (("query", query_labels), ("database", database_labels)):
        if len(labels) == 0:
            raise ValueError(f"the {side} set is empty (0 labels)")
    q_num, d_num = _as_numbers(query_labels), _as_numbers(database_labels)
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


def format_table(metrics: dict[str, float]) -> str:
    """Two-column plain-text table of the metrics."""
    width = max(len(k) for k in metrics)
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  ----------"]
    for key, value in metrics.items():
        if key == "ceiling_gap":  # certifies C to ~1e-7: six decimals would show 0
            shown = f"{value:.2e}"
        elif not float(value).is_integer() or math.isinf(value):
            shown = f"{value:.6f}"
        else:
            shown = f"{int(value)}"
        lines.append(f"{key:<{width}}  {shown}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from rl_gap.metrics.functional import evaluate_embeddings
    from rl_gap.metrics.functional.arguments import check_block_size, check_count
    from rl_gap.metrics.functional.suite import check_suite_arguments

    # option errors before any file is read
    check_block_size(args.block_size, "--block-size")
    check_count(args.bootstrap, "--bootstrap")
    check_suite_arguments(args.ks, args.precision, args.map_at)
    queries, q_pt_labels = load_embeddings(args.queries)
    database, d_pt_labels = (
        (queries, q_pt_labels) if args.database is None else load_embeddings(args.database)
    )
    if args.query_labels:
        query_labels = load_labels(args.query_labels)
    elif q_pt_labels is not None:
        query_labels = np.asarray(q_pt_labels)
    else:
        raise ValueError("query labels are needed: --query-labels or a 'labels' entry in the .pt")
    if args.database_labels:
        database_labels = load_labels(args.database_labels)
    elif d_pt_labels is not None:
        database_labels = np.asarray(d_pt_labels)
    elif args.database is None:
        database_labels = query_labels
    else:
        raise ValueError("database labels are needed: --database-labels")
    query_labels, database_labels = _encode(query_labels, database_labels)
    if args.normalize:
        queries = torch.nn.functional.normalize(torch.as_tensor(np.asarray(queries)).float(), dim=1)
        database = (
            queries
            if args.database is None
            else torch.nn.functional.normalize(torch.as_tensor(np.asarray(database)).float(), dim=1)
        )
    exclude_self = args.exclude_self
    if exclude_self and args.database is not None and not _same_file(args.queries, args.database):
        raise ValueError(
            f"--exclude-self drops pair (i, i) as query i's own item, which holds only when the "
            f"queries are the database; --database {args.database} is not the --queries file "
            f"{args.queries}. Drop --exclude-self (or --database for leave-one-out)"
        )
    if args.database is None and not exclude_self:
        # Each query would retrieve itself first (R@1 = 1): rank it against the others.
        exclude_self = True
        print(
            "no --database: leave-one-out, each query ranked against the other queries "
            "(self pairs excluded)",
            file=sys.stderr,
        )
    metrics = evaluate_embeddings(
        queries, database, query_labels, database_labels, exclude_self=exclude_self,
        ks=tuple(args.ks), precisions=tuple(args.precision), map_at=tuple(args.map_at),
        ceiling=False if args.no_ceiling else None, protocol=args.protocol,
        bootstrap=args.bootstrap, block_size=args.block_size, device=args.device, seed=args.seed,
    )  # fmt: skip
    if metrics["num_positive_pairs"] == 0:
        raise ValueError(
            "no query has a relevant database item"
            + (" other than itself (leave-one-out)" if exclude_self else "")
            + ": every metric would be NaN; check the labels"
        )
    print(format_table(metrics))
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(metrics, indent=2, allow_nan=True))
        print(f"wrote {out}")
    return 0
