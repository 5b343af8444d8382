"""Benchmark tail-extrapolated mAP@k and the vectorised GPD fit.

1. End to end: Q queries × S sampled distractors given as embeddings (default
   1000 × 10^6, d = 128) → the nested top-T state (GEMM blocks), then the
   sample / count / evt predictions with 95% query-bootstrap intervals.
   Printed next to the time of the bare GEMM over the same pairs.
2. GPD: the vectorised profile-likelihood fit over all queries vs a per-query
   ``scipy.stats.genpareto.fit`` loop (timed on a subset, scaled per fit).
3. ``--extrapolate``: ``rl-gap extrapolate`` on saved embeddings (1,000 queries ×
   10 positives × a 10^5 sample, N = 10^8, k = 1000), time and peak memory in a
   child process, as a ratio to scoring the sample; then the same with ``--plot``.

    .venv/bin/python benchmarks/bench_tail.py
    .venv/bin/python benchmarks/bench_tail.py --queries 200 --sample 200000   # quick
    .venv/bin/python benchmarks/bench_tail.py --extrapolate   # rl-gap extrapolate, 1000 x 10 x 100k

Timings on a shared machine are noisy: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import time

import torch

from rl_gap.metrics.tail import TailPredictor
from rl_gap.metrics.tail.bayes import BayesTailConfig
from rl_gap.metrics.tail.gpd import fit_gpd
from rl_gap.metrics.tail.hardness import fit_tail
from rl_gap.metrics.tail.sampling import NestedTopK, stream_scores


def make_embeddings(Q: int, S: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(64, d, generator=g)
    q = torch.nn.functional.normalize(
        centers[torch.randint(0, 64, (Q,), generator=g)] + torch.randn(Q, d, generator=g), dim=1
    )
    # Positive noise of norm ≈ 0.5..1.1 (per-query difficulty): cosine to the query ≈ 0.7..0.9.
    spread = torch.empty(Q, 1).uniform_(0.5, 1.1, generator=g).repeat_interleave(3, 0) / d**0.5
    pos = torch.nn.functional.normalize(
        q.repeat_interleave(3, 0) + spread * torch.randn(3 * Q, d, generator=g), dim=1
    )
    x = torch.empty(S, d)
    for start in range(0, S, 131072):
        n = min(131072, S - start)
        comp = torch.randint(0, 64, (n,), generator=g)
        x[start : start + n] = torch.nn.functional.normalize(
            centers[comp] + torch.randn(n, d, generator=g), dim=1
        )
    pos_scores = (q.repeat_interleave(3, 0) * pos).sum(1).double().view(Q, 3)
    return q, pos_scores, x


def bench_end_to_end(args) -> None:
    q, pos, x = make_embeddings(args.queries, args.sample, args.dim, args.seed)
    t0 = time.perf_counter()
    for start in range(0, x.shape[0], args.block):
        _ = q @ x[start : start + args.block].T
    gemm_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    state = NestedTopK(q.shape[0], 4000)
    stream_scores(q, x, state, block_size=args.block)
    stream_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    predictor = TailPredictor(pos, state, args.k)
    results, seconds = {}, {}
    for name in ("sample", "count", "evt", "tail"):
        t2 = time.perf_counter()
        results[name] = predictor.estimate(name, args.gallery_size, n_boot=1000)
        seconds[name] = time.perf_counter() - t2
    predict_s = time.perf_counter() - t1
    # The tail estimator without its bootstrap bias correction, for the cost ratio.
    plain = TailPredictor(pos, state, args.k, bayes=BayesTailConfig(bias_replicates=0))
    t2 = time.perf_counter()
    results["tail, uncorrected"] = plain.estimate("tail", args.gallery_size, n_boot=1000)
    seconds["tail, uncorrected"] = time.perf_counter() - t2
    total = stream_s + predict_s
    print(
        f"end to end: {args.queries} queries x {args.sample:,} distractors (d = {args.dim}), mAP@{args.k} at N = {args.gallery_size:,}"
    )
    print(f"  bare GEMM over all pairs      {gemm_s:7.2f} s")
    print(f"  stream: GEMM + top-T state     {stream_s:7.2f} s  ({stream_s / gemm_s:.2f}x GEMM)")
    print(f"  4 predictions + intervals      {predict_s:7.2f} s")
    print(f"  total                          {total:7.2f} s  (target < 60 s)")
    for name, est in results.items():
        print(
            f"    {name:>17}: {est.map:.4f}  [{est.ci[0]:.4f}, {est.ci[1]:.4f}]  {seconds[name]:6.2f} s"
        )
    ratio = seconds["tail"] / seconds["tail, uncorrected"]
    print(f"  tail bias correction costs     {ratio:7.1f}x  the uncorrected tail estimator")
    return predictor


def bench_gpd(predictor: TailPredictor, n_scipy: int) -> None:
    from scipy.stats import genpareto

    top, n = predictor.level(-1)
    fit_tail(top, n)  # warm-up
    # Excesses exactly as the EVT estimator builds them.
    n_exc = int(round(0.05 * min(4000, n)))
    excess = (top[:, :n_exc] - top[:, n_exc : n_exc + 1]).clamp_min(0)
    t0 = time.perf_counter()
    fit = fit_gpd(excess)
    vec_s = time.perf_counter() - t0
    m = min(n_scipy, excess.shape[0])
    t0 = time.perf_counter()
    diffs = []
    for i in range(m):
        c, _, scale = genpareto.fit(excess[i].numpy(), floc=0)
        if -1 < c < 0:
            diffs.append(abs(c - float(fit.xi[i])))
    scipy_per_fit = (time.perf_counter() - t0) / m
    scipy_all = scipy_per_fit * excess.shape[0]
    print(f"GPD fit: {excess.shape[0]} queries x {excess.shape[1]} excesses")
    print(f"  vectorised profile likelihood  {vec_s:7.3f} s")
    print(
        f"  scipy genpareto.fit loop       {scipy_all:7.3f} s  (timed on {m}, {scipy_per_fit * 1e3:.1f} ms/fit)"
    )
    print(f"  speed-up                       {scipy_all / vec_s:7.1f}x  (target >= 20x)")
    if diffs:
        print(
            f"  max |xi - xi_scipy| where scipy is inside (-1, 0): {max(diffs):.2e} over {len(diffs)} fits"
        )


_EXTRAPOLATE_CHILD = """
import argparse, resource, sys, time
from rl_gap.commands import extrapolate
parser = argparse.ArgumentParser()
extrapolate.add_arguments(parser)
args = parser.parse_args(sys.argv[1:])
t0 = time.perf_counter()
extrapolate.run(args)
print(f"BENCH {time.perf_counter() - t0:.3f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")
"""


def bench_extrapolate(args) -> None:
    """``rl-gap extrapolate`` on saved embeddings, in a child process (its own peak memory).

    Q queries × ``--positives-per-query`` positives × S sampled distractors, the default
    estimator with its interval and flags; the time excludes the child's imports and is
    shown as a ratio to scoring the sample (the bare GEMM over the same pairs).
    """
    import os
    import subprocess
    import sys
    import tempfile

    import numpy as np

    q, _, x = make_embeddings(args.queries, args.sample, args.dim, args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    m = args.positives_per_query
    spread = torch.empty(args.queries, 1).uniform_(0.5, 1.1, generator=g) / args.dim**0.5
    p = torch.nn.functional.normalize(
        q.repeat_interleave(m, 0)
        + spread.repeat_interleave(m, 0) * torch.randn(m * args.queries, args.dim, generator=g),
        dim=1,
    )
    t0 = time.perf_counter()
    for start in range(0, x.shape[0], args.block):
        _ = q @ x[start : start + args.block].T
    score_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        for name, arr in (("q", q), ("p", p), ("x", x)):
            np.save(os.path.join(tmp, f"{name}.npy"), arr.numpy())
        np.save(os.path.join(tmp, "owner.npy"), np.repeat(np.arange(args.queries), m))
        common = [
            "--queries", f"{tmp}/q.npy", "--positives", f"{tmp}/p.npy",
            "--positive-query", f"{tmp}/owner.npy", "--distractors", f"{tmp}/x.npy",
            "--gallery-size", str(args.extrapolate_gallery), "--k", str(args.k), "--no-progress",
        ]  # fmt: skip
        rows = []
        for label, extra in (("default", []), ("--plot", ["--plot", f"{tmp}/curve.png"])):
            done = subprocess.run(
                [sys.executable, "-c", _EXTRAPOLATE_CHILD, *common, *extra],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            line = [r for r in done.stdout.splitlines() if r.startswith("BENCH")][-1]
            seconds, rss_kb = float(line.split()[1]), int(line.split()[2])
            rows.append((label, seconds, rss_kb / 2**20))
    print(
        f"rl-gap extrapolate: {args.queries} queries x {m} positives x {args.sample:,} sampled "
        f"distractors (d = {args.dim}), N = {args.extrapolate_gallery:,}, k = {args.k}, "
        "default estimator + interval + flags"
    )
    print(f"  scoring the sample (bare GEMM)  {score_s:7.2f} s")
    for label, seconds, gib in rows:
        print(
            f"  {label:<30} {seconds:7.2f} s  ({seconds / score_s:5.1f}x scoring)  "
            f"peak {gib:.2f} GiB  (target <= 60 s, <= 2 GB; --plot <= 10 s more)"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--sample", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--k", type=int, default=1000)
    p.add_argument("--gallery-size", type=int, default=20_000_000)
    p.add_argument("--block", type=int, default=32768)
    p.add_argument("--scipy-fits", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--extrapolate",
        action="store_true",
        help="benchmark rl-gap extrapolate instead (defaults: --sample 100000, N = 10^8)",
    )
    p.add_argument("--positives-per-query", type=int, default=10)
    p.add_argument("--extrapolate-gallery", type=int, default=100_000_000)
    args = p.parse_args(argv)
    if args.extrapolate:
        if "--sample" not in (argv or __import__("sys").argv):
            args.sample = 100_000
        bench_extrapolate(args)
        return 0
    predictor = bench_end_to_end(args)
    bench_gpd(predictor, args.scipy_fits)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
