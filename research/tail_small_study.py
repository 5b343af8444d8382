"""Per-query predictions of the small-sample worlds at many GPD thresholds, for choosing a rule.

For every world of ``research.tail_small`` (a split half, or all) this runs
once: the truth (the pool's realized mAP@100), ``sample``, ``count`` and the
plug-in GPD (``evt_support``: ξ ≤ 0 for cosine worlds, ξ ≤ 0.5 for inner
products, by the world's declared similarity) fitted to n exceedances for
every n of ``EXCESSES``, and the default estimator as it stands. The per-query
AP@100 of each is saved, so that threshold rules are compared offline
(``research.tail_small_table``) without refitting.

    nice -n 10 env OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python -m research.tail_small_study \\
        --split design --out /tmp/tailsmall/design.pt
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from research.tail_pools import sorted_pool_counts
from research.tail_small import K, load_small_split, parse_key, small_params, small_pool
from rl_gap.metrics.tail import DEFAULT_ESTIMATOR, TailPredictor, state_from_scores
from rl_gap.metrics.tail.diagnostics import refit_at
from rl_gap.metrics.tail.hardness import DEFAULT_CONFIG
from rl_gap.metrics.tail.rank_law import ap_at_k_from_counts, ap_at_k_from_hardness

EXCESSES = (10, 15, 20, 30, 50, 75, 100, 150, 200, 400)


def run_world(key: str, cache: str, estimators: tuple[str, ...] = ()) -> dict:
    data = small_pool(key, cache)
    s, kind, index = parse_key(key)
    params = small_params(s, kind, index)
    score_range = (-1.0, 1.0) if params.score == "cosine" else None
    N = data["pool"]
    config = dataclasses.replace(DEFAULT_CONFIG, score_range=score_range)
    state = state_from_scores(data["sample"], max(K, 4000), seed=0)
    pred = TailPredictor(data["pos_scores"], state, K, config, seed=0)
    counts = torch.where(pred.valid, sorted_pool_counts(data), torch.zeros_like(pred.j))
    truth_pq = ap_at_k_from_counts(pred.j, pred.valid, counts, K)
    t0 = time.perf_counter()
    per_query = {
        "sample": pred.per_query("sample", N),
        "count": pred.per_query("count", N),
    }
    xi = {}
    for n in EXCESSES:
        x, fit = refit_at(pred, n, "evt_support")
        per_query[f"evt@{n}"] = ap_at_k_from_hardness(pred.j, pred.valid, x, N, K, "plugin")
        xi[n] = fit.xi
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    est = pred.estimate(DEFAULT_ESTIMATOR, N, n_boot=1000)
    default_s = time.perf_counter() - t0
    sampled, _, _ = pred.hardness("count")
    others = {}
    for name in estimators:
        t0 = time.perf_counter()
        other = pred.estimate(name, N, n_boot=1000, diagnose=False)
        seconds = time.perf_counter() - t0
        checked = pred.estimate(name, N, n_boot=1000)  # its checks, untimed
        others[name] = {
            "map": other.map,
            "ci": other.ci,
            "ci_total": checked.ci_total,
            "flags": checked.flags,
            "seconds": seconds,
        }
    return {
        "key": key,
        "S": pred.sample_size,
        "N": N,
        "kind": kind,
        "score": params.score,
        "truth": float(truth_pq[pred.query_ok].mean()),
        "truth_pq": truth_pq,
        "query_ok": pred.query_ok,
        "per_query": per_query,
        "xi": xi,
        "counts": sampled * pred.sample_size,
        "valid": pred.valid,
        "default": {
            "map": est.map,
            "ci": est.ci,
            "ci_total": est.ci_total,
            "flags": est.flags,
            "diagnostics": est.diagnostics.as_dict(),
        },
        "seconds": {"fits": fit_s, "default": default_s},
        "estimators": others,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", default="/tmp/tailsmall")
    p.add_argument("--split", choices=("design", "held_out"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument(
        "--estimators",
        default="",
        help="also these estimators (comma-separated; timed without their checks)",
    )
    p.add_argument("--sizes", default=None, help="only these sample sizes, e.g. 10k,20k")
    args = p.parse_args(argv)
    estimators = tuple(e.strip() for e in args.estimators.split(",") if e.strip())
    keys = load_small_split()[args.split]
    if args.sizes:
        keys = [k for k in keys if k.rpartition("-S")[2] in args.sizes.split(",")]
    rows = []
    for key in keys:
        row = run_world(key, args.cache, estimators)
        rows.append(row)
        d = row["default"]
        print(
            f"{key:>16}: truth {row['truth']:.4f}  count {row['per_query']['count'].nanmean():.4f}"
            f"  default {d['map']:.4f} ({len(d['flags'])} flags)  {row['seconds']['default']:.1f} s"
            + "".join(f"  {n} {o['map']:.4f}" for n, o in row["estimators"].items()),
            flush=True,
        )
        torch.save(rows, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
