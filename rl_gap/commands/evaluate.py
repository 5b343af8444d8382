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
    rl-gap evaluate --queries all.npy --query-labels labels.npy --exclude-self
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

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
        "--exclude-self", action="store_true", help="leave-one-out: queries are the database"
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


def _load_pt(path: Path):
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except RuntimeError:  # not a zip-format checkpoint: no mmap
        return torch.load(path, map_location="cpu", weights_only=True)


def load_embeddings(path: str) -> tuple[np.ndarray | torch.Tensor, object | None]:
    """Embeddings (memory-mapped) and, for a ``.pt`` dict, its labels entry."""
    p = _require(path)
    if p.suffix == ".npy":
        return np.load(p, mmap_mode="r"), None
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
        return np.asarray(np.load(p))
    if p.suffix == ".pt":
        obj = _load_pt(p)
        if isinstance(obj, dict):
            obj = obj.get("labels")
        if not isinstance(obj, torch.Tensor):
            raise ValueError(f"{p}: no label tensor; {_LAYOUT}")
        return obj.numpy()
    if p.suffix in (".txt", ".csv"):
        lines = [line.strip() for line in p.read_text().splitlines()]
        return np.asarray([line.split(",")[0] for line in lines if line])
    raise ValueError(f"{p}: unknown label format {p.suffix!r}; {_LAYOUT}")


def _encode(query_labels: np.ndarray, database_labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shared integer codes for both label arrays (strings or integers)."""
    if query_labels.dtype.kind in "iu" and database_labels.dtype.kind in "iu":
        return query_labels.astype(np.int64), database_labels.astype(np.int64)
    both = np.concatenate([query_labels.astype(str), database_labels.astype(str)])
    _, codes = np.unique(both, return_inverse=True)
    return codes[: len(query_labels)], codes[len(query_labels) :]


def format_table(metrics: dict[str, float]) -> str:
    """Two-column plain-text table of the metrics."""
    width = max(len(k) for k in metrics)
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  ----------"]
    for key, value in metrics.items():
        shown = (
            f"{value:.6f}"
            if not float(value).is_integer() or math.isinf(value)
            else f"{int(value)}"
        )
        lines.append(f"{key:<{width}}  {shown}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from rl_gap.metrics.functional import evaluate_embeddings

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
    metrics = evaluate_embeddings(
        queries, database, query_labels, database_labels, exclude_self=args.exclude_self,
        ks=tuple(args.ks), precisions=tuple(args.precision), map_at=tuple(args.map_at),
        ceiling=False if args.no_ceiling else None, protocol=args.protocol,
        bootstrap=args.bootstrap, block_size=args.block_size, device=args.device, seed=args.seed,
    )  # fmt: skip
    print(format_table(metrics))
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(metrics, indent=2, allow_nan=True))
        print(f"wrote {out}")
    return 0
