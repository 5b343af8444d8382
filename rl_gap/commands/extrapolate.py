"""``rl-gap extrapolate``: predict web-scale mAP@k from saved embeddings of a distractor sample.

Inputs (``.npy`` memory-mapped, ``.pt`` tensors, or a folder written by the
prediction writer holding ``embeddings.npy`` (n, d) and ``labels.npy`` (n,)):
- ``--queries``      (Q, d) query embeddings;
- ``--positives``    (P, d) positive embeddings, tied to queries either by
  ``--positive-query`` (P,) integer query indices, or by labels
  (``--query-labels`` (Q,), ``--positive-labels`` (P,): relevant iff equal; read as
  ``evaluate`` reads labels: .npy, .pt, or .txt/.csv one per line;
  a folder's ``labels.npy`` serves as these labels unless they are given;
  when ``--queries`` and ``--positives`` are the same file or folder, an item
  is never its own positive: leave-one-out);
- ``--distractors``  (S, d) embeddings of an i.i.d. distractor sample (e.g.
  drawn with ``rl_gap.metrics.tail.sampling.sample_mask``); optional
  ``--distractor-ids`` (S,) assign the nested sub-samples by hash, otherwise
  by position (the sample must then be in random order). The sample is refused
  when it is the query or positive set itself.

Prints a table of at most 100 columns (``--format json|csv`` instead: the
estimators with 95% query-bootstrap intervals, the interval widened by the
threshold spread and the sufficient-budget check; flags listed below it; the JSON's
top-level ``flags`` hold the run's own notes, e.g. a ``--k`` capped at N + positives), with a
progress bar per stage on stderr; ``--json PATH`` also writes the results there
(nothing is written without it), and ``--plot`` draws predicted mAP@k against
gallery size (after the JSON is written). The score range the default
estimator bounds its tail by comes from the embeddings: ``--similarity auto``
(the default) measures every query, positive and distractor norm and reads the
scores as cosine ([−1, 1]) when all are unit (within 1%, or ``--l2-normalize``),
as unbounded inner products otherwise; ``--similarity cosine`` on embeddings
that are not unit-norm is refused.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from rl_gap.commands.extrapolate_inputs import (  # noqa: F401  (names kept importable here)
    check_embeddings,
    folder_labels,
    integer_indices,
    label_codes,
    load_array,
    read_labels,
    same_embeddings,
    same_file,
    top_positive_scores,
)
from rl_gap.commands.extrapolate_output import (  # noqa: F401  (names kept importable here)
    CSV_COLUMNS,
    TABLE_WIDTH,
    Progress,
    check_plot_path,
    emit,
    results_csv,
    write_json,
)
from rl_gap.metrics.tail.bayes import DEFAULT_BAYES, BayesTailConfig
from rl_gap.metrics.tail.build import new_state, tail_predictor
from rl_gap.metrics.tail.hardness import SIMILARITY_RANGES, TailConfig, resolve_score_range
from rl_gap.metrics.tail.pipeline import ESTIMATE_STAGES
from rl_gap.metrics.tail.rank_law import RANK_LAWS
from rl_gap.metrics.tail.registry import (
    DEFAULT_ESTIMATOR,
    PREDICTIVE,
    available_estimators,
    get_estimator,
)
from rl_gap.metrics.tail.sampling import DEFAULT_FRACTIONS, hash_uniform, part_of, stream_scores

#: Query-by-distractor scores held per streamed block (float32: 256 MiB).
SCORE_BLOCK = 1 << 26


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    add = parser.add_argument
    add(
        "--queries",
        required=True,
        help="(Q, d) query embeddings (.npy, .pt, or a folder with embeddings.npy + labels.npy)",
    )
    add("--positives", required=True, help="(P, d) positive embeddings (file or folder)")
    add("--positive-query", help="(P,) index of the query each positive belongs to")
    add("--query-labels", help="(Q,) labels (numbers or strings); relevant iff equal")
    add("--positive-labels", help="(P,) labels of the positives")
    add(
        "--distractors",
        required=True,
        help="(S, d) embeddings of the i.i.d. distractor sample (file or folder)",
    )
    add("--distractor-ids", help="(S,) integer ids: nested sub-samples by hash")
    add("--gallery-size", type=int, required=True, help="N, distractors to predict for")
    add(
        "--k",
        type=int,
        default=1000,
        help="AP cut-off (mAP@k); capped at the gallery's length N + positives",
    )
    add(
        "--estimators",
        default=DEFAULT_ESTIMATOR,
        help=f"comma-separated subset of {','.join(available_estimators())}",
    )
    add(
        "--similarity",
        default="auto",
        choices=("auto", *SIMILARITY_RANGES),
        help="the scores' similarity: auto measures the embedding norms (all unit: cosine, "
        "bounded in [-1, 1]; else dot, unbounded)",
    )
    add(
        "--score-range",
        default=None,
        metavar="LOW,HIGH",
        help="the scores' range, replacing the similarity's (e.g. 0,1)",
    )
    add(
        "--rank-law",
        default=None,
        choices=(*RANK_LAWS, PREDICTIVE),
        help="None: each estimator's own (predictive for tail, plugin otherwise)",
    )
    add("--n-boot", type=int, default=1000, help="query-bootstrap replicates (0: no interval)")
    add(
        "--nested-boot",
        type=int,
        default=0,
        help="replicates of the joint (queries x distractors) bootstrap for nested_ci",
    )
    add(
        "--bias-replicates",
        type=int,
        default=DEFAULT_BAYES.bias_replicates,
        help="simulated samples for the tail estimator's bootstrap bias correction (0 = off)",
    )
    add("--l2-normalize", action="store_true", help="L2-normalise all embeddings first")
    add(
        "--block-size",
        type=int,
        default=32768,
        help="distractors per GEMM block (fewer with many queries: Q x block <= 2^26)",
    )
    add(
        "--format",
        default="table",
        choices=("table", "json", "csv"),
        help="what is printed: a table (fits 100 columns), JSON or CSV",
    )
    add("--json", default=None, help="also write the results as JSON here (default: only print)")
    add("--plot", help="draw predicted mAP@k vs gallery size to this image")
    add("--seed", type=int, default=0, help="bootstrap and sub-sample seed")
    add("--no-progress", action="store_true", help="no progress bars (on stderr)")  # fmt: skip


def _check_options(args, estimators: list[str]) -> None:
    known = available_estimators()
    unknown = [e for e in estimators if e not in known]
    if unknown or not estimators:
        raise ValueError(f"unknown estimators {unknown}; known: {', '.join(known)}")
    if args.k < 1:
        raise ValueError(f"--k must be >= 1, got {args.k}")
    for option, value, minimum in (
        ("--n-boot", args.n_boot, 0), ("--nested-boot", args.nested_boot, 0),
        ("--block-size", args.block_size, 1), ("--gallery-size", args.gallery_size, 1),
        ("--bias-replicates", args.bias_replicates, 0),
    ):  # fmt: skip
        if value < minimum:
            raise ValueError(f"{option} must be >= {minimum}, got {value}")


#: Embeddings whose norms all lie within this share of 1 are unit-normalised (float16
#: storage of unit vectors rounds norms by ~1e-3).
UNIT_NORM_TOLERANCE = 0.01


class NormRange:
    """The smallest and largest row norm seen so far (embeddings measured as they are read)."""

    def __init__(self) -> None:
        self.low, self.high = float("inf"), 0.0

    def add(self, rows: torch.Tensor) -> torch.Tensor:
        if rows.numel():
            norms = rows.to(torch.float64).norm(dim=1)
            self.low = min(self.low, float(norms.min()))
            self.high = max(self.high, float(norms.max()))
        return rows

    @property
    def unit(self) -> bool:
        return (
            abs(self.low - 1.0) <= UNIT_NORM_TOLERANCE
            and abs(self.high - 1.0) <= UNIT_NORM_TOLERANCE
        )


def _score_range(args, norms: NormRange | None = None) -> tuple[float, float] | None:
    """The declared range (``--score-range``, ``--similarity``), or the measured one (auto).

    ``norms`` are those of every embedding scored (after ``--l2-normalize``); None
    before they are measured, when only an explicit declaration is checked.
    """
    if args.score_range is None:
        if args.similarity == "auto":
            if norms is None:
                return None
            return resolve_score_range("cosine" if norms.unit else "dot")
        if args.similarity == "cosine" and norms is not None and not norms.unit:
            raise ValueError(
                f"--similarity cosine, but the embedding norms lie in [{norms.low:.4g}, "
                f"{norms.high:.4g}], not 1: pass --l2-normalize for cosine scores, or "
                "--similarity dot (or auto) for inner products"
            )
        return resolve_score_range(args.similarity)
    try:
        pair = tuple(float(v) for v in args.score_range.split(","))
    except ValueError:
        pair = ()
    if len(pair) != 2:
        raise ValueError(f"--score-range must be LOW,HIGH (e.g. -1,1), got {args.score_range!r}")
    return resolve_score_range(pair)


def _positives(args, queries, positives, k: int, progress: Progress) -> torch.Tensor:
    """(Q, w) each query's top-k positive scores (``top_positive_scores``)."""
    n_queries, n_pos = queries.shape[0], positives.shape[0]
    update = progress.stage("scoring positives", n_queries)
    if args.positive_query:
        owner = integer_indices(
            np.array(load_array(args.positive_query, "--positive-query", "(P,) ints")),
            "--positive-query",
        )
        if owner.shape != (n_pos,) or (
            owner.numel() and (owner.min() < 0 or owner.max() >= n_queries)
        ):
            raise ValueError(f"--positive-query must be ({n_pos},) indices in [0, {n_queries})")
        out = top_positive_scores(queries, positives, k, owner=owner)
        update(n_queries)
        return out
    query_labels = args.query_labels or folder_labels(args.queries, "--queries")
    positive_labels = args.positive_labels or folder_labels(args.positives, "--positives")
    if not (query_labels and positive_labels):
        raise ValueError(
            "tie positives to queries with --positive-query, or --query-labels and "
            "--positive-labels (or pass prediction-writer folders, whose labels.npy are used)"
        )
    ql = read_labels(query_labels, "--query-labels", n_queries)
    pl = read_labels(positive_labels, "--positive-labels", n_pos)
    if ql.shape != (n_queries,) or pl.shape != (n_pos,):
        raise ValueError(
            f"labels must be ({n_queries},) and ({n_pos},), got {ql.shape}, {pl.shape}"
        )
    qc, pc = label_codes(ql, pl)
    # Queries are the positives' own set: leave-one-out, an item is not its own positive.
    loo = same_file(args.queries, args.positives)
    return top_positive_scores(
        queries, positives, k, query_codes=qc, positive_codes=pc, leave_one_out=loo,
        progress=lambda done, total: update(done),
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    _check_options(args, estimators)
    _score_range(args)  # a malformed --score-range is refused before any scoring
    if args.plot:
        check_plot_path(args.plot)
    queries_raw, positives_raw, distractors = _load_embeddings(args)
    norms = NormRange()
    prep = _embedding_reader(args.l2_normalize, norms)
    queries, positives = prep(queries_raw), prep(positives_raw)
    k, k_note = _capped_k(args.k, args.gallery_size + positives.shape[0])
    progress = Progress(not args.no_progress)
    try:
        pos = _positives(args, queries, positives, k, progress)
        config = TailConfig()
        state = _score_sample(args, estimators, queries, distractors, k, config, prep, progress)
        # Every embedding has been read (distractors block by block): the range is known.
        score_range = _score_range(args, norms)
        config = TailConfig(score_range=score_range)
        bayes = BayesTailConfig(bias_replicates=args.bias_replicates)
        predictor = tail_predictor(pos, state, k, config=config, seed=args.seed, bayes=bayes)
        out = _estimate_all(args, estimators, predictor, score_range, progress)
        out["embedding_norms"] = [norms.low, norms.high]
        # The run's own notes (each estimator's "flags" are its support checks).
        out["requested_k"], out["flags"] = args.k, [] if k_note is None else [k_note]
        emit(out, args.format)
        from rl_gap.training.wandb_mode import log_command_result

        log_command_result(out)  # the command's W&B run, when W&B is on
        # Results first: a failing plot must never lose them.
        write_json(args.json, out, quiet=args.format != "table")
        if args.plot:
            _plot(args, estimators, predictor, out, progress)
    finally:
        progress.close()
    return 0


def _load_embeddings(args):
    """(queries, positives, distractors) as loaded (memory maps stay maps), shapes checked."""
    for other in ("queries", "positives"):
        if same_embeddings(args.distractors, getattr(args, other)):
            raise ValueError(
                f"--distractors {args.distractors!r} is the --{other} set: the distractor "
                f"sample must be items that are neither queries nor positives"
            )
    queries = load_array(args.queries, "--queries", "(Q, d) float")
    check_embeddings(queries, "queries")
    positives = load_array(args.positives, "--positives", "(P, d) float")
    check_embeddings(positives, "positives", queries.shape[1])
    distractors = load_array(args.distractors, "--distractors", "(S, d) float")
    check_embeddings(distractors, "distractors", queries.shape[1])
    if args.gallery_size < distractors.shape[0]:
        raise ValueError(
            f"--gallery-size ({args.gallery_size}) must be >= the sample size "
            f"({distractors.shape[0]})"
        )
    return queries, positives, distractors


def _embedding_reader(l2_normalize: bool, norms: NormRange | None = None):
    """``prep(x)``: a float32 tensor copy of rows ``x``, finite, L2-normalised if asked;
    its row norms are added to ``norms``."""

    def prep(x) -> torch.Tensor:
        t = torch.tensor(np.asarray(x), dtype=torch.float32)  # copy: memory maps are read-only
        if not bool(torch.isfinite(t).all()):
            raise ValueError("embeddings contain NaN or ±inf")
        t = torch.nn.functional.normalize(t, dim=1) if l2_normalize else t
        return t if norms is None else norms.add(t)

    return prep


def _capped_k(k: int, length: int) -> tuple[int, str | None]:
    """``(k used, note)``: AP@k is AP past the gallery's length (N + positives), so a
    larger k only costs memory and is capped; the note (None when not capped) says so."""
    if k <= length:
        return k, None
    note = (
        f"--k {k:,} exceeds the gallery's length (N + positives = {length:,}); "
        f"using k = {length:,} (the same metric)"
    )
    print(f"note: {note}", file=sys.stderr)
    return length, note


def _score_sample(args, estimators, queries, distractors, k, config, prep, progress):
    """The nested top-T state of the distractor sample, streamed in blocks."""
    S = distractors.shape[0]
    part = None
    if args.distractor_ids:
        ids = np.asarray(load_array(args.distractor_ids, "--distractor-ids", "(S,) ints"))
        if ids.shape != (S,):
            raise ValueError(f"--distractor-ids must have shape ({S},), got {ids.shape}")
        part = part_of(torch.from_numpy(hash_uniform(ids, args.seed)), DEFAULT_FRACTIONS)
    # Kept per query: what k and the requested estimators read, never more than the sample;
    # keyed by row, the nested bootstrap resamples distractors jointly across queries.
    state = new_state(
        queries.shape[0], k, config, estimators=estimators, sample_size=S,
        keyed=args.nested_boot > 0
        or (args.n_boot > 0 and any(get_estimator(e).fixed_query_interval for e in estimators)),
    )  # fmt: skip
    update = progress.stage("scoring distractors", S)

    class _Checked:  # validates each block as it is read, so a memory map is never loaded whole
        shape = distractors.shape

        def __getitem__(self, sl):
            return prep(distractors[sl])

    # A block's scores are (Q, block): with many queries, fewer distractors per block.
    block = min(args.block_size, max(1024, SCORE_BLOCK // queries.shape[0]))
    stream_scores(queries, _Checked(), state, part=part, block_size=block,
                  progress=update)  # fmt: skip
    return state


def _estimate_all(args, estimators, predictor, score_range, progress) -> dict:
    """Every requested estimator's result, and the metric measured on the sub-samples."""
    results = {}
    for name in estimators:
        update = progress.stage(f"{name}", len(ESTIMATE_STAGES) - 1)
        est = predictor.estimate(
            name, args.gallery_size, args.rank_law, n_boot=args.n_boot, nested_boot=args.nested_boot,
            # The default's interval already carries the sample's noise; its S/4 · S/2 · S
            # check (two more predictive-law predictions) is left to predict_map(budget=True).
            budget=get_estimator(name).per_positive
            and not get_estimator(name).fixed_query_interval,
            on_stage=lambda stage, update=update: update(ESTIMATE_STAGES.index(stage), stage),
        )  # fmt: skip
        results[name] = est.to_dict()
    update = progress.stage("measured on the sub-samples", 1)
    measured = predictor.measured(n_boot=min(args.n_boot, 500))
    update(1)
    return {
        "gallery_size": args.gallery_size,
        "k": predictor.k,
        "sample_size": predictor.sample_size,
        "n_queries": predictor.n_queries_valid,
        "n_excluded": predictor.n_excluded,
        "score_range": None if score_range is None else list(score_range),
        "estimators": results,
        "measured": measured,
    }


def _plot(args, estimators, predictor, out: dict, progress) -> None:
    from rl_gap.metrics.tail.plot import plot_extrapolation

    update = progress.stage("plot", 1)
    out["plot"] = plot_extrapolation(
        predictor, args.gallery_size, args.plot, tuple(estimators), args.rank_law,
        n_boot=min(args.n_boot, 200) or 200,
    )  # fmt: skip
    update(1)
    print(f"plot written to {args.plot}", file=sys.stderr)
    write_json(args.json, out, quiet=True)
