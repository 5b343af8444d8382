"""Validate tail-extrapolated mAP@k against the truth on large synthetic pools.

For each world of ``research.tail_worlds`` (six tail geometries:
isotropic, low-dimensional, anisotropic mixture, heavy-tailed Student-t,
hierarchical classes, near-duplicate bumps) a pool of N distractors (default
2M) is streamed block by block and never held as a score matrix: per query we
keep the exact top-k of the pool (the true mAP@k at N) and, through the
deterministic hash sampler, the top-4000 of a 5% sample (S = 100k, 20×
extrapolation). Every estimator then predicts mAP@k at N from the sample; the
table gives, per estimator × world, the error, whether the 95% interval covers
the truth, and the estimator's time.

    OMP_NUM_THREADS=1 .venv/bin/python research/validate_tail.py            # 6 worlds, 2M, 5%
    OMP_NUM_THREADS=1 .venv/bin/python research/validate_tail.py --seeds 0,1,2,3 --cache /tmp/tail
    OMP_NUM_THREADS=1 .venv/bin/python research/validate_tail.py --pool 400000 --worlds mixture

``--by-count`` splits each hardness estimator's error over the positives by
their sampled count K_S (0, 1–4, ≥ 5): the groups add up to the error. With
``--resamples`` every sample is split, and the held-out samples' mean per group
is printed.
``--half-check`` checks the ``tail`` fit of every sample's nested half against
the other half, out of sample (``research.tail_check``): per band of
predicted depth, the other half's actual and predicted counts above the
positives the half does not reach; and, beside it, the same check at the scale
the prediction needs, which only a validation can run: the whole sample's fit
against the rest of the pool.
``--nested-boot B`` adds, for count/evt/tail, the joint interval that also
resamples the distractor sample once for all queries (the sample is keyed by
pool position) and reports how many cells it covers.

``--resamples R`` draws R independent hashed samples of each pool (the same
pool and truth; only the sampler's hash seed differs) and prints, per
estimator × world, the bias (mean error) and the sample-noise sd (spread over
the samples): which part of an error is bias, and the noise floor of mean
|err| that no estimator fed one sample can go below. Samples 1.. are held out:
sample 0 is the one the per-seed tables report and estimators were chosen on.
With ``--nested-boot`` every sample gets the joint interval.

    OMP_NUM_THREADS=1 .venv/bin/python research/validate_tail.py --seeds 0,1 --resamples 4 \
        --estimators count,evt,loguniform,tail/plugin,tail --cache /tmp/tail

1000 queries by default (about the size of ILIAS or INSTRE): at 200 the
distractor sample alone moves the prediction by 0.007–0.016. ``--cache``
keeps the streamed states (~200 MB per world and sample, with the keys) so that later runs with the same
settings only re-run the estimators.

Worlds and their parameters are fixed up front (seeded, not tuned to an
estimator); ``--seed`` draws a fresh realisation of every world.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: research/

from research.tail_check import out_of_sample_check  # noqa: E402
from research.tail_report import (  # noqa: E402
    COUNT_GROUPS,
    format_tail_check,
    print_bias_and_noise,
    print_held_out_by_count,
    print_summary,
    print_table,
)
from research.tail_worlds import WORLDS, World  # noqa: E402
from rl_gap.metrics.tail import ESTIMATORS, HARDNESS_ESTIMATORS, TailPredictor  # noqa: E402
from rl_gap.metrics.tail.hardness import sample_counts  # noqa: E402
from rl_gap.metrics.tail.rank_law import (  # noqa: E402
    ap_at_k_from_hardness,
    ap_from_precision_terms,
)
from rl_gap.metrics.tail.registry import PREDICTIVE, resolve_rank_law  # noqa: E402
from rl_gap.metrics.tail.sampling import (  # noqa: E402
    DEFAULT_FRACTIONS,
    NestedTopK,
    hash_uniform,
    part_of,
)

#: Estimators in table order (the paper's baselines, then the tail-aware ones).
ORDER = ("sample", "single_x", "powerlaw", "loguniform", "count", "evt", "tail/plugin", "tail")


def sample_seed(seed: int, resample: int) -> int:
    """Hash seed of the ``resample``-th independent sample of the pool of ``seed`` (0: ``seed``)."""
    return seed if resample == 0 else 100003 * resample + seed


def stream_world(
    world: World, pool: int, rate: float, k: int, block: int, seed: int, resamples: int = 1
):
    """Stream ``pool`` distractors once: (full top-k state, [nested top-T state of each of
    ``resamples`` independent hashed samples], seconds)."""
    Q = world.queries.shape[0]
    full = NestedTopK(Q, k, (1.0,))
    # Keyed by pool position: the nested bootstrap resamples distractors jointly across queries.
    samples = [NestedTopK(Q, max(4000, k), DEFAULT_FRACTIONS, keyed=True) for _ in range(resamples)]
    g = torch.Generator().manual_seed(seed * 104729 + 17)
    t0 = time.perf_counter()
    for start in range(0, pool, block):
        n = min(block, pool - start)
        x = world.distractors(n, g)
        scores = world.queries @ x.T
        full.push(scores, 0)
        ids = np.arange(start, start + n)
        for r, sample in enumerate(samples):
            u = hash_uniform(ids, seed=sample_seed(seed, r))
            keep = torch.from_numpy(u < rate)
            # Nested sub-sample parts from the same hash: u/rate is uniform in [0, 1) inside the sample.
            part = part_of(torch.from_numpy(u / rate)[keep], DEFAULT_FRACTIONS)
            sample.push(scores[:, keep], part, torch.from_numpy(ids)[keep])
    return full, samples, time.perf_counter() - t0


def _state_names(resamples: int) -> list[str]:
    return ["full", "sample"] + [f"sample{r}" for r in range(1, resamples)]


def cached_stream(world: World, args: argparse.Namespace):
    """``stream_world``, or its states saved by an earlier run with the same settings."""
    stream = (args.pool, args.rate, args.k, args.block, args.seed, args.resamples)
    if not args.cache:
        return stream_world(world, *stream)
    key = f"{world.name}-q{args.queries}-m{args.max_pos}-n{args.pool}-r{args.rate}-k{args.k}-s{args.seed}"
    path = os.path.join(args.cache, key + ".pt")
    saved = torch.load(path) if os.path.exists(path) else None
    names = _state_names(args.resamples)
    # States saved before keys, or with fewer resamples, are streamed again.
    if saved is not None and all(f"{n}_keys" in saved for n in names):
        states = [
            NestedTopK.from_tensors(
                saved[f"{n}_top"], saved[f"{n}_seen"], saved[f"{n}_fractions"], saved[f"{n}_keys"]
            )
            for n in names
        ]
        return states[0], states[1:], saved["seconds"]
    full, samples, seconds = stream_world(world, *stream)
    os.makedirs(args.cache, exist_ok=True)
    saved = {"seconds": seconds}
    for n, state in zip(names, [full, *samples]):
        saved.update({f"{n}_top": state.top, f"{n}_seen": state.seen, f"{n}_keys": state.keys})
        saved[f"{n}_fractions"] = state.fractions
    torch.save(saved, path + ".tmp")
    os.replace(path + ".tmp", path)
    return full, samples, seconds


def _covers(ci, truth: float) -> bool:
    return bool(ci[0] <= truth <= ci[1])


def evaluate_world(world: World, args: argparse.Namespace, estimators: tuple[str, ...]) -> dict:
    full, samples, stream_s = cached_stream(world, args)
    truth_pred = TailPredictor(world.pos_scores, full, args.k)
    truth = truth_pred.estimate("sample", args.pool, n_boot=10).map
    pred, *others = [TailPredictor(world.pos_scores, s, args.k, seed=args.seed) for s in samples]
    row = {"world": world.name, "truth": truth, "sample_size": pred.sample_size, "N": args.pool}
    row["stream_seconds"] = stream_s
    if args.half_check:
        row["half_check"] = [out_of_sample_check(p).as_dict() for p in (pred, *others)]
        row["pool_check"] = [
            out_of_sample_check(p, level=-1, population=full).as_dict() for p in (pred, *others)
        ]
    for name in estimators:
        estimator, _, law = name.partition("/")  # "tail/plugin": an estimator with a given rank law
        nested = args.nested_boot if estimator in JOINT_ESTIMATORS else 0
        options = {"rank_law": law or None, "n_boot": args.n_boot, "nested_boot": nested}
        t0 = time.perf_counter()
        est = pred.estimate(estimator, args.pool, **options)
        seconds = time.perf_counter() - t0
        row[name] = cell = {
            "map": est.map,
            "ci": list(est.ci),
            "err": est.map - truth,
            "covered": _covers(est.ci, truth),
            "seconds": seconds,
        }
        if est.nested_ci is not None:
            cell["nested_ci"] = list(est.nested_ci)
            cell["nested_covered"] = _covers(est.nested_ci, truth)
            cell["sample_noise_sd"] = est.sample_noise_sd
        split = args.by_count and estimator in HARDNESS_ESTIMATORS
        if split:
            cell["by_count"] = error_by_sampled_count(
                pred, truth_pred, estimator, law or None, args.pool
            )
        if others:  # the same estimator on independent samples of the same pool
            ests = [est] + [p.estimate(estimator, args.pool, **options) for p in others]
            cell["resample_errs"] = [e.map - truth for e in ests]
            if split:
                cell["resample_by_count"] = [cell["by_count"]] + [
                    error_by_sampled_count(p, truth_pred, estimator, law or None, args.pool)
                    for p in others
                ]
            cell["resample_covered"] = [_covers(e.ci, truth) for e in ests]
            if est.nested_ci is not None:
                cell["resample_nested_covered"] = [_covers(e.nested_ci, truth) for e in ests]
    return row


#: Estimators that get the joint (queries × distractors) interval with ``--nested-boot``.
JOINT_ESTIMATORS = ("count", "evt", "tail")


def error_by_sampled_count(
    pred: TailPredictor, truth: TailPredictor, estimator: str, law: str | None, gallery_size: int
) -> dict:
    """The estimator's mAP error split over positives by their sampled count K_S.

    Each positive's AP@k term (its precision over min(k, m)) is predicted
    (``tail``: its predictive term; the others: with the other positives of its
    query masked out, their ranks j kept) and compared with its realized term
    in the pool; the groups' errors add up to the estimator's error.
    """
    _, counts, _ = pred.hardness(estimator)
    pool_counts, _ = sample_counts(truth.pos_sorted, truth.valid, truth.level(-1)[0])
    j, valid, k = pred.j, pred.valid, pred.k
    rank = j + pool_counts
    realized = torch.where(valid & (rank <= k), j / rank, torch.zeros_like(j))
    if estimator == "tail" and resolve_rank_law(estimator, law) == PREDICTIVE:
        predicted = pred.tail_terms(gallery_size)
    else:
        predicted = torch.zeros_like(realized)
        x, _, _ = pred.hardness(estimator)
        for col in range(valid.shape[1]):
            only = torch.zeros_like(valid)
            only[:, col] = valid[:, col]
            ap = ap_at_k_from_hardness(
                j, only, x, gallery_size, k, resolve_rank_law(estimator, law)
            )
            # One positive left: its AP@k is its term divided by min(k, 1) = 1.
            predicted[:, col] = torch.nan_to_num(ap, nan=0.0)
    out = {}
    rows = pred.query_ok
    for label, lo, hi in COUNT_GROUPS:
        group = valid & (counts >= lo) & (counts < hi if hi is not None else True)
        err = ap_from_precision_terms((predicted - realized) * group, valid, k)
        out[label] = {"err": float(err[rows].mean()), "positives": int(group.sum())}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", default=",".join(WORLDS), help="comma-separated subset of worlds")
    p.add_argument(
        "--estimators",
        default=",".join(ORDER),
        help="comma-separated estimators; NAME/LAW fixes the rank law (e.g. tail/plugin)",
    )
    p.add_argument("--pool", type=int, default=2_000_000, help="distractor pool size N")
    p.add_argument("--rate", type=float, default=0.05, help="sampling rate (S = rate·N)")
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--max-pos", type=int, default=6)
    p.add_argument("--k", type=int, default=1000)
    p.add_argument("--block", type=int, default=65536)
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument(
        "--nested-boot",
        type=int,
        default=0,
        help="replicates of the joint queries × distractors bootstrap for count/evt/tail (0 = off)",
    )
    p.add_argument(
        "--resamples",
        type=int,
        default=1,
        help="independent hashed samples of each pool (R > 1 prints every estimator's bias and "
        "sample-noise sd over them)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--seeds",
        default=None,
        help="comma-separated seeds (overrides --seed): one table per seed, then the summary",
    )
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument(
        "--by-count",
        action="store_true",
        help="split each hardness estimator's error by the positives' sampled count K_S",
    )
    p.add_argument(
        "--half-check",
        action="store_true",
        help="check every sample's tail fit on its nested half against the other half, "
        "and on the whole sample against the rest of the pool",
    )
    p.add_argument(
        "--cache",
        default=None,
        help="folder for the streamed states (re-used by later runs with the same settings)",
    )
    args = p.parse_args(argv)
    worlds = [w.strip() for w in args.worlds.split(",") if w.strip()]
    estimators = tuple(e.strip() for e in args.estimators.split(",") if e.strip())
    unknown = [e for e in estimators if e.partition("/")[0] not in ESTIMATORS]
    if unknown:
        raise SystemExit(f"unknown estimators {unknown}; known: {', '.join(ESTIMATORS)}")
    if args.resamples < 1:
        raise SystemExit(f"--resamples must be >= 1, got {args.resamples}")
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    all_rows = []
    for seed in seeds:
        args.seed = seed
        rows = []
        for name in worlds:
            world = World(name, args.queries, args.max_pos, seed)
            row = evaluate_world(world, args, estimators)
            row["seed"] = seed
            rows.append(row)
            summary = "  ".join(f"{e} {row[e]['err']:+.4f}" for e in estimators)
            print(f"{name:>16}: truth {row['truth']:.4f}  {summary}", flush=True)
            for i, check in enumerate(row.get("half_check", [])):
                print(f"{'':>18}half check (sample {i}): {format_tail_check(check)}", flush=True)
                pool = format_tail_check(row["pool_check"][i])
                print(f"{'':>18}pool check (sample {i}): {pool}", flush=True)
            for e in estimators:
                if "resample_errs" in row[e]:
                    errs = " ".join(f"{x:+.4f}" for x in row[e]["resample_errs"])
                    print(f"{'':>18}{e} error on each independent sample: {errs}", flush=True)
                for i, parts in enumerate(
                    row[e].get("resample_by_count", [row[e].get("by_count")])
                ):
                    if parts is None:
                        continue
                    split = "  ".join(
                        f"{g} {v['err']:+.4f} ({v['positives']})" for g, v in parts.items()
                    )
                    label = f" (sample {i})" if "resample_by_count" in row[e] else ""
                    print(f"{'':>18}{e} error by sampled count{label}: {split}", flush=True)
        print_table(rows, estimators, args)
        all_rows.extend(rows)
    if len(seeds) > 1:
        print_summary(all_rows, estimators, seeds)
    if args.resamples > 1:
        print_bias_and_noise(all_rows, estimators, args)
        if args.by_count:
            print_held_out_by_count(all_rows, estimators)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": all_rows, "args": vars(args)}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
