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
    rl-gap evaluate --queries runs/x/seed0/embeddings/test         # an rl-gap predict folder

Without ``--database`` the queries are the database and evaluation is
leave-one-out (self pairs excluded; said on stderr). A ``--database`` holding the
query embeddings (same file, or equal shape, dtype and values) is refused unless
``--exclude-self`` (leave-one-out) or ``--include-self`` (self pairs count) says
which is meant. Labels compare as numbers when both sides are numbers (``1.0``
equals ``1``; integer ids exactly, as int64), else as exact class names
(``rl_gap.commands.labels``). ``--output`` is replaced atomically.
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

from rl_gap.commands.atomic_output import write_text_atomic
from rl_gap.commands.labels import encode_labels, load_labels
from rl_gap.commands.npy_io import load_npy, load_pt
from rl_gap.commands.progress import Bar, add_quiet_argument, progress

_LAYOUT = (
    "expected .npy (N, dim) / .pt tensor or {'embeddings', 'labels'} dict for embeddings; "
    ".npy/.pt (N,) integers or .txt/.csv one label per line for labels"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--queries", required=True,
        help="query embeddings (.npy or .pt), or an rl-gap predict folder <run>/embeddings/<split>",
    )  # fmt: skip
    parser.add_argument(
        "--database", help="database embeddings or predict folder; default: the queries "
        "(a CLIP retrieval folder: its captions)",
    )  # fmt: skip
    parser.add_argument("--query-labels", help="query labels (.npy/.pt/.txt/.csv)")
    parser.add_argument("--database-labels", help="database labels; default: query labels")
    self_pairs = parser.add_mutually_exclusive_group()
    self_pairs.add_argument(
        "--exclude-self",
        action="store_true",
        help="leave-one-out: queries are the database (the default without --database; with "
        "--database, only when it holds the --queries embeddings)",
    )
    self_pairs.add_argument(
        "--include-self",
        action="store_true",
        help="queries are the database and each query's own item counts as a retrieved "
        "positive (without it, a --database identical to --queries is refused)",
    )
    parser.add_argument("--block-size", type=int, default=2048, help="GEMM block rows/columns")
    parser.add_argument("--device", default="cpu", help="scoring device, e.g. cpu or cuda:0")
    parser.add_argument(
        "--normalize",
        action="store_true",
        help="L2-normalise (cosine scores), block by block: the embeddings are never copied",
    )
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 5, 10], help="R@k cut-offs")
    parser.add_argument("--map-at", type=int, nargs="*", default=[], help="mAP@k cut-offs")
    parser.add_argument("--precision", type=float, nargs="+", default=[0.9], help="R@P levels")
    parser.add_argument("--protocol", action="store_true", help="shared-threshold protocol")
    parser.add_argument("--bootstrap", type=int, default=0, help="bootstrap samples for CIs")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the consistency ceiling")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", help="write the metrics as JSON here")
    add_quiet_argument(parser)  # the engine's blocks, on stderr


def predict_folders(args: argparse.Namespace) -> None:
    """``--queries`` / ``--database`` given as an ``rl-gap predict`` output folder
    (``<run>/embeddings/<split>/``) become its files, in place on ``args``.

    A folder with ``embeddings.npy`` + ``labels.npy`` gives embeddings and labels (without
    ``--database``: leave-one-out on it). A CLIP retrieval folder (``image_embeddings.npy``,
    ``text_embeddings.npy`` and their labels) without ``--database`` evaluates image ->
    caption retrieval: the images query, the captions are the database, relevance is the
    caption group. Explicit ``--*-labels`` win.
    """
    for side in ("queries", "database"):
        folder = getattr(args, side)
        if folder is None or not Path(folder).is_dir():
            continue
        folder = Path(folder)
        labels = "query_labels" if side == "queries" else "database_labels"
        if (folder / "embeddings.npy").is_file():
            prefix = ""
        elif side == "queries" and (folder / "image_embeddings.npy").is_file():
            prefix = "image_"
            if args.database is None and (folder / "text_embeddings.npy").is_file():
                args.database = str(folder / "text_embeddings.npy")
                if args.database_labels is None:
                    args.database_labels = str(folder / "text_labels.npy")
        elif side == "database" and (folder / "text_embeddings.npy").is_file():
            prefix = "text_"
        else:
            raise FileNotFoundError(
                f"--{side} {folder}: not an rl-gap predict folder (it holds embeddings.npy + "
                "labels.npy, or a CLIP retrieval set's image_/text_embeddings.npy + labels)"
            )
        setattr(args, side, str(folder / f"{prefix}embeddings.npy"))
        if getattr(args, labels) is None:
            setattr(args, labels, str(folder / f"{prefix}labels.npy"))


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


def _rows(x: np.ndarray | torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return (
        x[start:stop] if isinstance(x, torch.Tensor) else torch.from_numpy(np.array(x[start:stop]))
    )


def _equal_rows(a, b, a0: int, b0: int, n: int) -> bool:
    """Rows ``a[a0:a0+n]`` equal ``b[b0:b0+n]``, compared in the narrower of the two dtypes
    (a float16 or float64 copy of float32 embeddings is the same embeddings)."""
    x, y = _rows(a, a0, a0 + 1), _rows(b, b0, b0 + 1)
    if x.is_floating_point() != y.is_floating_point():
        return False
    narrow = x.dtype if x.element_size() <= y.element_size() else y.dtype
    for i in {0, n // 2, n - 1}:  # a first, middle and last row probe stops most mismatches
        if not torch.equal(_rows(a, a0 + i, a0 + i + 1).to(narrow),
                           _rows(b, b0 + i, b0 + i + 1).to(narrow)):  # fmt: skip
            return False
    step = max(1, (16 << 20) // max(1, a.shape[1] * 8))  # ~16 MiB blocks
    return all(
        torch.equal(_rows(a, a0 + i, a0 + min(i + step, n)).to(narrow),
                    _rows(b, b0 + i, b0 + min(i + step, n)).to(narrow))
        for i in range(0, n, step)
    )  # fmt: skip


def same_embeddings(
    a_path: str, b_path: str, a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor
) -> bool:
    """True when two inputs hold the same embeddings: one file, or equal shape and values
    (in the narrower dtype of the two; compared block by block)."""
    if _same_file(a_path, b_path):
        return True
    if tuple(a.shape) != tuple(b.shape) or a.ndim != 2 or a.shape[0] == 0:
        return False
    return _equal_rows(a, b, 0, 0, a.shape[0])


def queries_offset_in_database(queries, database) -> int | None:
    """The row where ``database`` holds the queries as one block (its first or last rows,
    as when distractors are appended to the queries or the other way round), else None."""
    q, d = queries.shape[0], database.shape[0]
    if queries.ndim != 2 or database.ndim != 2 or queries.shape[1] != database.shape[1]:
        return None
    if q == 0 or d <= q:
        return None
    for start in (0, d - q):
        if _equal_rows(queries, database, 0, start, q):
            return start
    return None


def load_embeddings(path: str) -> tuple[np.ndarray | torch.Tensor, object | None]:
    """Embeddings (memory-mapped) and, for a ``.pt`` dict, its labels entry."""
    p = _require(path)
    if p.suffix == ".npy":
        return load_npy(p), None
    if p.suffix == ".pt":
        obj = load_pt(p)
        if isinstance(obj, dict):
            if "embeddings" not in obj:
                raise ValueError(f"{p}: dict without an 'embeddings' entry; {_LAYOUT}")
            return obj["embeddings"], obj.get("labels")
        if isinstance(obj, torch.Tensor):
            return obj, None
        raise ValueError(f"{p}: holds {type(obj).__name__}; {_LAYOUT}")
    raise ValueError(f"{p}: unknown embeddings format {p.suffix!r}; {_LAYOUT}")


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


def _labels(args: argparse.Namespace, queries, database, q_pt_labels, d_pt_labels):
    """Query and database labels (files, ``.pt`` entries, or the queries' own), encoded."""
    if args.query_labels:
        query_labels = load_labels(args.query_labels, queries.shape[0])
    elif q_pt_labels is not None:
        query_labels = np.asarray(q_pt_labels)
    else:
        raise ValueError("query labels are needed: --query-labels or a 'labels' entry in the .pt")
    if args.database_labels:
        database_labels = load_labels(args.database_labels, database.shape[0])
    elif d_pt_labels is not None:
        database_labels = np.asarray(d_pt_labels)
    elif args.database is None:
        database_labels = query_labels
    else:
        raise ValueError("database labels are needed: --database-labels")
    return encode_labels(query_labels, database_labels)


def exclude_self_pairs(
    args: argparse.Namespace, queries, database
) -> tuple[bool, torch.Tensor | None]:
    """``(exclude_self, query_index)``: whether pair (i, i) is dropped (leave-one-out when the
    queries are the database, unless ``--include-self``), or the database row of each query
    to drop when the database holds the queries as a block of its rows. A database holding
    the query embeddings needs one of ``--exclude-self`` / ``--include-self`` (self pairs
    would inflate every metric)."""
    if args.database is None:
        if not (args.exclude_self or args.include_self):
            # Each query would retrieve itself first (R@1 = 1): rank it against the others.
            print(
                "no --database: leave-one-out, each query ranked against the other queries "
                "(self pairs excluded)",
                file=sys.stderr,
            )
        return not args.include_self, None
    identical = same_embeddings(args.queries, args.database, queries, database)
    offset = None if identical else queries_offset_in_database(queries, database)
    if offset is not None:
        where = f"rows {offset}..{offset + queries.shape[0] - 1}"
        if not (args.exclude_self or args.include_self):
            raise ValueError(
                f"--database {args.database} holds the --queries {args.queries} embeddings as "
                f"its {where}: each query would retrieve itself as a positive, inflating every "
                "metric. Add --exclude-self to drop each query's own row, or --include-self if "
                "self pairs are meant to count"
            )
        if args.include_self:
            return False, None
        return False, torch.arange(queries.shape[0]) + offset
    if args.exclude_self and not identical:
        raise ValueError(
            f"--exclude-self drops pair (i, i) as query i's own item, which holds only when the "
            f"queries are the database; --database {args.database} is not the --queries file "
            f"{args.queries} nor a copy of it. Drop --exclude-self (or --database for leave-one-out)"
        )
    if args.include_self and not identical:
        raise ValueError(
            f"--include-self counts pair (i, i) as query i's own item, which holds only when the "
            f"queries are the database; --database {args.database} is not the --queries file "
            f"{args.queries} nor a copy of it. Drop --include-self"
        )
    if identical and not (args.exclude_self or args.include_self):
        raise ValueError(
            f"--database {args.database} holds the same embeddings as --queries {args.queries}: "
            "each query would retrieve itself as a positive, inflating every metric. Add "
            "--exclude-self for leave-one-out, or --include-self if self pairs are meant to count"
        )
    return args.exclude_self, None


def _pass_counter(bar: Bar):
    """Engine progress -> the bar: one count per counting pass (the protocol's halves
    and the R@k problem are passes of their own)."""
    passes = [0]

    def update(done: int, total: int) -> None:
        if done == 0:
            passes[0] += 1
            bar.start(f"engine pass {passes[0]}: blocks", total)
        else:
            bar.set(done, total)

    return update


def run(args: argparse.Namespace) -> int:
    from rl_gap.metrics.functional import evaluate_embeddings
    from rl_gap.metrics.functional.arguments import check_block_size, check_count
    from rl_gap.metrics.functional.progress import block_progress
    from rl_gap.metrics.functional.suite import check_suite_arguments

    # option errors before any file is read
    check_block_size(args.block_size, "--block-size")
    check_count(args.bootstrap, "--bootstrap")
    check_suite_arguments(args.ks, args.precision, args.map_at)
    predict_folders(args)
    queries, q_pt_labels = load_embeddings(args.queries)
    database, d_pt_labels = (
        (queries, q_pt_labels) if args.database is None else load_embeddings(args.database)
    )
    query_labels, database_labels = _labels(args, queries, database, q_pt_labels, d_pt_labels)
    exclude_self, query_index = exclude_self_pairs(args, queries, database)
    with progress(args.quiet) as bar, block_progress(_pass_counter(bar)):
        metrics = evaluate_embeddings(
            queries, database, query_labels, database_labels, exclude_self=exclude_self,
            query_index=query_index,
            ks=tuple(args.ks), precisions=tuple(args.precision), map_at=tuple(args.map_at),
            ceiling=False if args.no_ceiling else None, protocol=args.protocol,
            bootstrap=args.bootstrap, block_size=args.block_size, device=args.device,
            seed=args.seed, normalize=args.normalize,
        )  # fmt: skip
    if metrics["num_positive_pairs"] == 0:
        raise ValueError(
            "no query has a relevant database item"
            + (
                " other than itself (leave-one-out)"
                if exclude_self or query_index is not None
                else ""
            )
            + ": every metric would be NaN; check the labels"
        )
    print(format_table(metrics))
    from rl_gap.training.wandb_mode import log_command_result

    log_command_result(metrics)  # the command's W&B run, when W&B is on
    if args.output:
        # atomic: a full disk or a kill mid-write leaves the previous file as it was
        out = write_text_atomic(args.output, json.dumps(metrics, indent=2, allow_nan=True))
        print(f"wrote {out}")
    return 0
