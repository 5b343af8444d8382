"""``rl-gap extrapolate``: predict web-scale mAP@k from saved embeddings of a distractor sample.

Inputs (``.npy`` memory-mapped, or ``.pt`` tensors):
- ``--queries``      (Q, d) query embeddings;
- ``--positives``    (P, d) positive embeddings, tied to queries either by
  ``--positive-query`` (P,) query indices, or by labels
  (``--query-labels`` (Q,), ``--positive-labels`` (P,): relevant iff equal);
- ``--distractors``  (S, d) embeddings of an i.i.d. distractor sample (e.g.
  drawn with ``rl_gap.metrics.tail_sampling.sample_mask``); optional
  ``--distractor-ids`` (S,) assign the nested sub-samples by hash, otherwise
  by position (the sample must then be in random order).

Prints a table (sample / count / evt with 95% query-bootstrap intervals and
the sufficient-budget diagnostic), writes JSON, and with ``--plot`` draws
predicted mAP@k against gallery size.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import numpy as np
import torch

from rl_gap.metrics.tail import ESTIMATORS, TailPredictor
from rl_gap.metrics.tail_hardness import TailConfig
from rl_gap.metrics.tail_rank import RANK_LAWS
from rl_gap.metrics.tail_sampling import (
    DEFAULT_FRACTIONS,
    NestedTopK,
    hash_uniform,
    part_of,
    stream_scores,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queries", required=True, help="(Q, d) query embeddings (.npy or .pt)")
    parser.add_argument("--positives", required=True, help="(P, d) positive embeddings")
    parser.add_argument("--positive-query", help="(P,) index of the query each positive belongs to")
    parser.add_argument(
        "--query-labels", help="(Q,) labels; with --positive-labels: relevant iff equal"
    )
    parser.add_argument("--positive-labels", help="(P,) labels of the positives")
    parser.add_argument(
        "--distractors", required=True, help="(S, d) embeddings of the i.i.d. distractor sample"
    )
    parser.add_argument("--distractor-ids", help="(S,) integer ids: nested sub-samples by hash")
    parser.add_argument(
        "--gallery-size", type=int, required=True, help="N, distractors to predict for"
    )
    parser.add_argument("--k", type=int, default=1000, help="AP cut-off (mAP@k)")
    parser.add_argument(
        "--estimators",
        default="sample,count,evt",
        help="comma-separated subset of sample,count,evt",
    )
    parser.add_argument("--rank-law", default="plugin", choices=RANK_LAWS)
    parser.add_argument("--n-boot", type=int, default=1000, help="query-bootstrap replicates")
    parser.add_argument(
        "--nested-boot", type=int, default=0, help="nested (queries x sample) bootstrap replicates"
    )
    parser.add_argument(
        "--l2-normalize", action="store_true", help="L2-normalise all embeddings first"
    )
    parser.add_argument("--block-size", type=int, default=32768, help="distractors per GEMM block")
    parser.add_argument(
        "--json", default="extrapolate.json", help="where to write the results ('' = don't)"
    )
    parser.add_argument("--plot", help="draw predicted mAP@k vs gallery size to this image")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true")


def load_array(path: str, name: str, layout: str) -> np.ndarray | torch.Tensor:
    """Load ``.npy`` (memory-mapped) or ``.pt`` (tensor or ndarray)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{name}: no file {path!r} (expected {layout} as .npy or .pt)")
    if path.endswith(".npy"):
        return np.load(path, mmap_mode="r")
    if path.endswith((".pt", ".pth")):
        obj = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        if not isinstance(obj, torch.Tensor | np.ndarray):
            raise ValueError(
                f"{name}: {path!r} must hold one tensor ({layout}), got {type(obj).__name__}"
            )
        return obj
    raise ValueError(f"{name}: unsupported file type {path!r}; use .npy or .pt ({layout})")


def _embeddings(x, name: str, dim: int | None = None) -> None:
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
        owner = torch.as_tensor(
            np.array(
                load_array(args.positive_query, "--positive-query", "(P,) ints")
            )  # copy: memory maps are read-only
        ).long()
        if owner.shape != (n_pos,) or (
            owner.numel() and (owner.min() < 0 or owner.max() >= n_queries)
        ):
            raise ValueError(f"--positive-query must be ({n_pos},) indices in [0, {n_queries})")
        return owner, torch.arange(n_pos)
    if args.query_labels and args.positive_labels:
        ql = torch.as_tensor(
            np.array(
                load_array(args.query_labels, "--query-labels", "(Q,) labels")
            )  # copy: memory maps are read-only
        )
        pl = torch.as_tensor(
            np.array(
                load_array(args.positive_labels, "--positive-labels", "(P,) labels")
            )  # copy: memory maps are read-only
        )
        if ql.shape != (n_queries,) or pl.shape != (n_pos,):
            raise ValueError(
                f"labels must be ({n_queries},) and ({n_pos},), got {tuple(ql.shape)}, {tuple(pl.shape)}"
            )
        qi, pj = (ql.view(-1, 1) == pl.view(1, -1)).nonzero(as_tuple=True)
        return qi, pj
    raise ValueError(
        "tie positives to queries with --positive-query, or --query-labels and --positive-labels"
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
    state = NestedTopK(queries.shape[0], max(args.k, config.n_top), DEFAULT_FRACTIONS)
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

    predictor = TailPredictor(pos, state, args.k, config, args.seed)
    results = {}
    for name in estimators:
        est = predictor.estimate(
            name,
            args.gallery_size,
            args.rank_law,
            args.n_boot,
            nested_boot=args.nested_boot,
            budget=name != "sample",
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
    if args.plot:
        from rl_gap.metrics.tail_plot import plot_extrapolation

        out["plot"] = plot_extrapolation(
            predictor, args.gallery_size, args.plot, tuple(estimators), args.rank_law
        )
        print(f"plot written to {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"results written to {args.json}")
    return 0


def _print_table(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"mAP@{out['k']} predicted at N = {out['gallery_size']:,} from S = {out['sample_size']:,} "
        f"({out['n_queries']} queries, {out['n_excluded']} without positives excluded)"
    )
    for col in ("estimator", f"mAP@{out['k']}", "95% CI", "budget S/4 · S/2 · S", "notes"):
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
            notes.append(f"nested CI [{r['nested_ci'][0]:.4f}, {r['nested_ci'][1]:.4f}]")
        table.add_row(
            name,
            f"{r['map']:.4f}",
            f"[{r['ci'][0]:.4f}, {r['ci'][1]:.4f}]",
            budget_txt,
            "; ".join(notes),
        )
    Console().print(table)
