"""Does an offline W&B run with system metrics and console capture on cost start-up or exit time?

Times ``wandb.init`` and ``run.finish`` of offline runs (20 logged steps, 20 printed lines,
2 s of "training" so the system-metrics sampler runs) with rl-gap's settings (stats and
console on) against the quiet ones (``console="off", x_disable_stats=True``), alternating,
in fresh temporary folders. The first run of the process includes wandb's service start.

    python benchmarks/bench_wandb_settings.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

SETTINGS = {"quiet": dict(console="off", x_disable_stats=True), "rl-gap": {}}


def one_run(settings: dict) -> tuple[float, float]:
    import wandb

    folder = tempfile.mkdtemp()
    start = time.perf_counter()
    run = wandb.init(project="bench", dir=folder, mode="offline",
                     settings=wandb.Settings(silent=True, **settings))  # fmt: skip
    started = time.perf_counter()
    for step in range(20):
        print("line", step)
        run.log({"x": step})
    time.sleep(2.0)
    stop = time.perf_counter()
    run.finish()
    return started - start, time.perf_counter() - stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("WANDB_SILENT", "true")
    results = []
    for _ in range(args.repeats):
        for name, settings in SETTINGS.items():
            results.append((name, *one_run(settings)))
    for name, init, finish in results:
        print(f"{name:>7}: init {init:5.2f} s   finish {finish:5.2f} s")


if __name__ == "__main__":
    main()
