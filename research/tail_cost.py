"""Time the default estimator against ``evt`` on one family world, its queries tiled to Q.

nice -n 19 env OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python -m research.tail_cost --tile 10
"""

from __future__ import annotations

import argparse
import time

from research.tail_pools import K, cached_pool
from rl_gap.metrics.tail import DEFAULT_ESTIMATOR, TailPredictor, state_from_scores


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=7)
    p.add_argument("--tile", type=int, default=10, help="repeat the queries (Q = 100 × tile)")
    p.add_argument("--cache", default="/tmp/tailfam")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    data = cached_pool(args.world, args.cache)
    pos = data["pos_scores"].repeat(args.tile, 1)
    sample = data["sample"].repeat(args.tile, 1)
    state = state_from_scores(sample, 4000)
    runs = {
        "evt (paper, no diagnostics)": ("evt", False),
        "evt + diagnostics": ("evt", True),
        "evt_support, no diagnostics": ("evt_support", False),
        f"default ({DEFAULT_ESTIMATOR}) + diagnostics": (DEFAULT_ESTIMATOR, True),
    }
    times = {}
    for label, (name, diag) in runs.items():
        best = float("inf")
        for _ in range(args.repeats):  # a fresh predictor: nothing cached between runs
            pred = TailPredictor(pos, state, K)
            t0 = time.perf_counter()
            pred.estimate(name, data["pool"], n_boot=1000, diagnose=diag)
            best = min(best, time.perf_counter() - t0)
        times[label] = best
    base = times["evt (paper, no diagnostics)"]
    print(f"Q = {pos.shape[0]}, S = {sample.shape[1]}, N = {data['pool']:,}")
    for label, t in times.items():
        print(f"{label:>34}: {t:6.2f} s  ({t / base:.1f}× evt)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
