"""``rl-gap extrapolate``: predict web-scale mAP@k from saved embeddings of a distractor sample.

Inputs (``.npy`` memory-mapped, ``.pt`` tensors, or a folder written by the
prediction writer holding ``embeddings.npy`` (n, d) and ``labels.npy`` (n,)):
- ``--queries``      (Q, d) query embeddings;
- ``--positives``    (P, d) positive embeddings, tied to queries either by
  ``--positive-query`` (P,) integer query indices, or by labels
  (``--query-labels`` (Q,), ``--positive-labels`` (P,): relevant iff equal;
  a folder's ``labels.npy`` serves as these labels unless they are given;
  when ``--queries`` and ``--positives`` are the same file or folder, an item
  is never its own positive: leave-one-out);
- ``--distractors``  (S, d) embeddings of an i.i.d. distractor sample (e.g.
  drawn with ``rl_gap.metrics.tail.sampling.sample_mask``); optional
  ``--distractor-ids`` (S,) assign the nested sub-samples by hash, otherwise
  by position (the sample must then be in random order).

Prints a table (the estimators with 95% query-bootstrap intervals and the
sufficient-budget diagnostic); ``--json PATH`` also writes the results there (nothing is
written without it), and ``--plot`` draws predicted mAP@k against gallery size (after the
JSON is written).
"""

from __future__ import annotations

import argparse
import json
import math
import os

import numpy as np
import torch

from rl_gap.commands.atomic_output import write_text_atomic
from rl_gap.commands.npy_io import load_npy
from rl_gap.metrics.tail import ESTIMATORS, HARDNESS_ESTIMATORS, TailPredictor
from rl_gap.metrics.tail.bayes import DEFAULT_BAYES, BayesTailConfig
from rl_gap.metrics.tail.estimate import PREDICTIVE
from rl_gap.metrics.tail.hardness import TailConfig
from rl_gap.metrics.tail.rank_law import RANK_LAWS
from rl_gap.metrics.tail.sampling import (
    DEFAULT_FRACTIONS,
    NestedTopK,
    hash_uniform,
    part_of,
    stream_scores,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--queries",
        required=True,
        help="(Q, d) query embeddings (.npy, .pt, or a folder with embeddings.npy + labels.npy)",
    )
    parser.add_argument(
        "--positives", required=True, help="(P, d) positive embeddings (file or folder)"
    )
    parser.add_argument("--positive-query", help="(P,) index of the query each positive belongs to")
    parser.add_argument(
        "--query-labels", help="(Q,) labels; with --positive-labels: relevant iff equal"
    )
    parser.add_argument("--positive-labels", help="(P,) labels of the positives")
    parser.add_argument(
        "--distractors",
        required=True,
        help="(S, d) embeddings of the i.i.d. distractor sample (file or folder)",
    )
    parser.add_argument("--distractor-ids", help="(S,) integer ids: nested sub-samples by hash")
    parser.add_argument(
        "--gallery-size", type=int, required=True, help="N, distractors to predict for"
    )
    parser.add_argument("--k", type=int, default=1000, help="AP cut-off (mAP@k)")
    parser.add_argument(
        "--estimators",
        default="sample,count,evt,evt_support,tail",
        help=f"comma-separated subset of {','.join(ESTIMATORS)}",
    )
    parser.add_argument(
        "--rank-law",
        default=None,
        choices=(*RANK_LAWS, PREDICTIVE),
        help="default: each estimator's own (predictive for tail, plugin otherwise)",
    )
    parser.add_argument("--n-boot", type=int, default=1000, help="query-bootstrap replicates")
    parser.add_argument(
        "--nested-boot",
        type=int,
        default=0,
        help="replicates of the joint (queries x distractors) bootstrap for nested_ci",
    )
    parser.add_argument(
        "--bias-replicates",
        type=int,
        default=DEFAULT_BAYES.bias_replicates,
        help="simulated samples for the tail estimator's bootstrap bias correction (0 = off)",
    )
    parser.add_argument(
        "--l2-normalize", action="store_true", help="L2-normalise all embeddings first"
    )
    parser.add_argument("--block-size", type=int, default=32768, help="distractors per GEMM block")
    parser.add_argument(
        "--json", default=None, help="also write the results as JSON here (default: only print)"
    )
    parser.add_argument("--plot", help="draw predicted mAP@k vs gallery size to this image")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true")


def load_array(path: str, name: str, layout: str) -> np.ndarray | torch.Tensor:
    """Load ``.npy`` (memory-mapped), ``.pt`` (tensor or ndarray), or a writer folder's embeddings."""
    if os.path.isdir(path):
        path = _folder_file(path, "embeddings.npy", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{name}: no file {path!r} (expected {layout} as .npy or .pt)")
    if path.endswith(".npy"):
        return load_npy(path)
    if path.endswith((".pt", ".pth")):
        obj = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        if not isinstance(obj, torch.Tensor | np.ndarray):
            raise ValueError(
                f"{name}: {path!r} must hold one tensor ({layout}), got {type(obj).__name__}"
            )
        return obj
    raise ValueError(f"{name}: unsupported file type {path!r}; use .npy or .pt ({layout})")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _folder_file(folder: str, filename: str, name: str) -> str:
    path = os.path.join(folder, filename)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{name}: folder {folder!r} has no {filename} (a prediction-writer folder holds "
            "embeddings.npy (n, d) and labels.npy (n,))"
        )
    return path


def folder_labels(path: str | None, name: str) -> str | None:
    """``labels.npy`` of a prediction-writer folder given as ``path``; None for a plain file."""
    if path is None or not os.path.isdir(path):
        return None
    return _folder_file(path, "labels.npy", name)


def integer_indices(values: np.ndarray, name: str) -> torch.Tensor:
    """int64 tensor of ``values``; a clear error for non-integer (e.g. float 2.5) entries."""
    arr = np.asarray(values)
    if arr.dtype.kind in "iu":
        return torch.as_tensor(arr.astype(np.int64))
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            first = arr[bad].ravel()[0]
            raise ValueError(
                f"{name} must hold integer indices; found {int(bad.sum())} non-integer "
                f"value(s), e.g. {first!r} (dtype {arr.dtype}); refusing to truncate them"
            )
        return torch.as_tensor(arr.astype(np.int64))
    raise ValueError(f"{name} must hold integer indices, got dtype {arr.dtype}")


def _embeddings(x, name: str, dim: int | None = None) -> None:
    floating = x.dtype.is_floating_point if isinstance(x, torch.Tensor) else x.dtype.kind == "f"
    if not floating:
        # an int8/uint8 (quantised) file would be cast and score as garbage: refuse, as evaluate
        raise ValueError(
            f"{name} must be floating point embeddings, got dtype {x.dtype}; "
            "dequantise them first (e.g. x.astype(np.float32) * scale)"
        )
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty (n, d) matrix, got shape {tuple(x.shape)}")
    if dim is not None and x.shape[1] != dim:
        raise ValueError(f"{name} has dimension {x.shape[1]}, the queries {dim}")


def positive_scores(
    queries: torch.Tensor,
    positives: torch.Tensor,
    query_index: torch.Tensor,
    positive_index: torch.Tensor,
) -> torch.Tensor:
    """(Q, m) NaN-padded scores of the relevant (query, positive) pairs."""
    Q = queries.shape[0]
    scores = (queries[query_index].double() * positives[positive_index].double()).sum(1)
    counts = torch.bincount(query_index, minlength=Q)
    order = torch.argsort(query_index, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(query_index)
    slot[order] = torch.arange(query_index.numel()) - starts[query_index[order]]
    out = torch.full(
        (Q, max(1, int(counts.max()) if counts.numel() else 1)), math.nan, dtype=torch.float64
    )
    out[query_index, slot] = scores
    return out


def _pairs(args, n_queries: int, n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    if args.positive_query:
        owner = integer_indices(
            np.array(load_array(args.positive_query, "--positive-query", "(P,) ints")),
            "--positive-query",
        )
        if owner.shape != (n_pos,) or (
            owner.numel() and (owner.min() < 0 or owner.max() >= n_queries)
        ):
            raise ValueError(f"--positive-query must be ({n_pos},) indices in [0, {n_queries})")
        return owner, torch.arange(n_pos)
    query_labels = args.query_labels or folder_labels(args.queries, "--queries")
    positive_labels = args.positive_labels or folder_labels(args.positives, "--positives")
    if query_labels and positive_labels:
        # np.array copies: memory maps are read-only.
        ql = torch.as_tensor(np.array(load_array(query_labels, "--query-labels", "(Q,) labels")))
        pl = torch.as_tensor(
            np.array(load_array(positive_labels, "--positive-labels", "(P,) labels"))
        )
        if ql.shape != (n_queries,) or pl.shape != (n_pos,):
            raise ValueError(
                f"labels must be ({n_queries},) and ({n_pos},), got {tuple(ql.shape)}, {tuple(pl.shape)}"
            )
        for option, lab in (("--query-labels", ql), ("--positive-labels", pl)):
            if lab.dtype.is_floating_point and not bool(torch.isfinite(lab).all()):
                # NaN equals nothing: those items would silently have no positives
                bad = int((~torch.isfinite(lab)).sum())
                raise ValueError(f"{option} holds {bad} NaN/inf label(s); labels are class ids")
        qi, pj = (ql.view(-1, 1) == pl.view(1, -1)).nonzero(as_tuple=True)
        if _same_file(args.queries, args.positives):
            # Queries are the positives' own set: leave-one-out, an item is not its own positive.
            keep = qi != pj
            qi, pj = qi[keep], pj[keep]
        return qi, pj
    raise ValueError(
        "tie positives to queries with --positive-query, or --query-labels and --positive-labels "
        "(or pass prediction-writer folders, whose labels.npy are used)"
    )


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("scoring distractors"),
                BarColumn(),
                TextColumn("{task.completed:,}/{task.total:,}"),
                TimeRemainingColumn(),
            )
            self.task = self.bar.add_task("", total=total)
            self.bar.start()

    def __call__(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run(args: argparse.Namespace) -> int:
    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    unknown = [e for e in estimators if e not in ESTIMATORS]
    if unknown or not estimators:
        raise ValueError(f"unknown estimators {unknown}; known: {', '.join(ESTIMATORS)}")
    if args.k < 1:
        raise ValueError(f"--k must be >= 1, got {args.k}")
    for option, value, minimum in (
        ("--n-boot", args.n_boot, 1), ("--nested-boot", args.nested_boot, 0),
        ("--block-size", args.block_size, 1), ("--gallery-size", args.gallery_size, 1),
        ("--bias-replicates", args.bias_replicates, 0),
    ):  # fmt: skip
        if value < minimum:
            raise ValueError(f"{option} must be >= {minimum}, got {value}")
    if args.plot:
        check_plot_path(args.plot)
    queries_raw = load_array(args.queries, "--queries", "(Q, d) float")
    _embeddings(queries_raw, "queries")
    positives_raw = load_array(args.positives, "--positives", "(P, d) float")
    _embeddings(positives_raw, "positives", queries_raw.shape[1])
    distractors = load_array(args.distractors, "--distractors", "(S, d) float")
    _embeddings(distractors, "distractors", queries_raw.shape[1])
    S = distractors.shape[0]
    if args.gallery_size < S:
        raise ValueError(f"--gallery-size ({args.gallery_size}) must be >= the sample size ({S})")

    def prep(x) -> torch.Tensor:
        t = torch.tensor(np.asarray(x), dtype=torch.float32)  # copy: memory maps are read-only
        if not bool(torch.isfinite(t).all()):
            raise ValueError("embeddings contain NaN or ±inf")
        return torch.nn.functional.normalize(t, dim=1) if args.l2_normalize else t

    queries, positives = prep(queries_raw), prep(positives_raw)
    qi, pj = _pairs(args, queries.shape[0], positives.shape[0])
    pos = positive_scores(queries, positives, qi, pj)

    part = None
    if args.distractor_ids:
        ids = np.asarray(load_array(args.distractor_ids, "--distractor-ids", "(S,) ints"))
        if ids.shape != (S,):
            raise ValueError(f"--distractor-ids must have shape ({S},), got {ids.shape}")
        part = part_of(torch.from_numpy(hash_uniform(ids, args.seed)), DEFAULT_FRACTIONS)

    config = TailConfig()
    # Keyed by row: the nested bootstrap then resamples distractors jointly across queries.
    state = NestedTopK(
        queries.shape[0], max(args.k, config.n_top), DEFAULT_FRACTIONS, keyed=args.nested_boot > 0
    )
    progress = _Progress(S, not args.no_progress)

    class _Checked:  # validates each block as it is read, so a memory map is never loaded whole
        shape = distractors.shape

        def __getitem__(self, sl):
            block = prep(distractors[sl])
            return block

    try:
        stream_scores(
            queries, _Checked(), state, part=part, block_size=args.block_size, progress=progress
        )
    finally:
        progress.close()

    bayes = BayesTailConfig(bias_replicates=args.bias_replicates)
    predictor = TailPredictor(pos, state, args.k, config, args.seed, bayes)
    results = {}
    for name in estimators:
        est = predictor.estimate(
            name,
            args.gallery_size,
            args.rank_law,
            args.n_boot,
            nested_boot=args.nested_boot,
            budget=name in HARDNESS_ESTIMATORS,
        )
        results[name] = est.to_dict()
    out = {
        "gallery_size": args.gallery_size,
        "k": args.k,
        "sample_size": S,
        "n_queries": predictor.n_queries_valid,
        "n_excluded": predictor.n_excluded,
        "estimators": results,
        "measured": predictor.measured(n_boot=min(args.n_boot, 500)),
    }
    _print_table(out)
    # Results first: a failing plot must never lose them.
    _write_json(args.json, out)
    if args.plot:
        from rl_gap.metrics.tail.plot import plot_extrapolation

        out["plot"] = plot_extrapolation(
            predictor, args.gallery_size, args.plot, tuple(estimators), args.rank_law
        )
        print(f"plot written to {args.plot}")
        _write_json(args.json, out, quiet=True)
    return 0


def _write_json(path: str | None, out: dict, quiet: bool = False) -> None:
    if not path:
        return
    write_text_atomic(path, json.dumps(out, indent=2))  # a full disk keeps the previous file
    if not quiet:
        print(f"results written to {path}")


def check_plot_path(path: str) -> None:
    """Raise ValueError unless matplotlib can write ``path``'s extension (checked before any work)."""
    from matplotlib.backend_bases import FigureCanvasBase

    supported = FigureCanvasBase.get_supported_filetypes()
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in supported:
        raise ValueError(
            f"--plot {path!r}: unsupported image extension {ext or '(none)'!r}; "
            f"use one of {', '.join(sorted(supported))}"
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"--plot {path!r}: folder {folder!r} does not exist")


def _print_table(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"mAP@{out['k']} predicted at N = {out['gallery_size']:,} from S = {out['sample_size']:,} "
        f"({out['n_queries']} queries, {out['n_excluded']} without positives excluded)"
    )
    columns = ("estimator", f"mAP@{out['k']}", "95% CI", "CI + threshold", "budget S/4 · S/2 · S")
    for col in (*columns, "supported", "notes"):
        table.add_column(col)
    for name, r in out["estimators"].items():
        budget = r.get("budget")
        budget_txt = ""
        if budget:
            levels = " · ".join(f"{lv['map']:.4f}" for lv in budget["levels"])
            budget_txt = f"{levels} ({'converged' if budget['converged'] else 'NOT converged'})"
        notes = []
        if name == "sample":
            notes.append(f"metric of the sample gallery (N = {out['sample_size']:,})")
        if "n_tail_fallback" in r:
            notes.append(f"{r['n_tail_fallback']} degenerate tails counted")
        if "nested_ci" in r:
            notes.append(
                f"joint CI [{r['nested_ci'][0]:.4f}, {r['nested_ci'][1]:.4f}] "
                f"(distractor-sample sd {r['sample_noise_sd']:.4f})"
            )
        total = r.get("ci_total")
        if "flags" in r:
            supported = "yes" if r["supported"] else "NO: " + "; ".join(r["flags"])
        else:
            supported = ""
        table.add_row(
            name,
            f"{r['map']:.4f}",
            f"[{r['ci'][0]:.4f}, {r['ci'][1]:.4f}]",
            f"[{total[0]:.4f}, {total[1]:.4f}]" if total else "",
            budget_txt,
            supported,
            "; ".join(notes),
        )
    Console().print(table)
