"""Time to a one-line error for bad ``rl-gap fit`` command lines, against ``import torch``.

    python benchmarks/bench_early_errors.py                       # this checkout, 3 runs each
    python benchmarks/bench_early_errors.py --before /work/main   # the same lines on another checkout

Each figure is the median wall time of fresh processes (``python -m rl_gap.cli ...``);
the ratio divides it by ``python -c "import torch"`` measured in the same run, which
makes figures from a loaded machine comparable. Every case must exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOP = "recipes/metric_learning/sop_gsap.yaml"


def cases(data: str) -> dict[str, list[str]]:
    fit = ["-m", "rl_gap.cli", "fit", "--config", SOP]
    return {
        "misspelt model key": [*fit, "--data.init_args.root", data, "--model.init_args.lrr", "1"],
        "bad value": [*fit, "--data.init_args.root", data, "--data.init_args.batch_size", "abc"],
        "missing data folder": [*fit, "--data.init_args.root", "/no/such/folder"],
        "accumulate_grad_batches": [
            *fit,
            "--data.init_args.root",
            data,
            "--trainer.accumulate_grad_batches",
            "4",
        ],  # fmt: skip
    }


def _run(args: list[str], checkout: Path) -> tuple[float, int, str]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "WANDB_MODE": "offline"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], cwd=checkout, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    return time.perf_counter() - start, proc.returncode, proc.stderr.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, default=None, help="another checkout to compare")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    checkouts = [("this", ROOT)] + ([("before", args.before)] if args.before else [])
    with tempfile.TemporaryDirectory() as data:
        torch_s = statistics.median(_run(["-c", "import torch"], ROOT)[0] for _ in range(args.runs))
        print(f"import torch: {torch_s:.2f} s (median of {args.runs})")
        print(f"{'case':<26} {'checkout':<8} {'seconds':>8} {'x torch':>8} {'exit':>5} lines")
        for name, case in cases(data).items():
            for label, checkout in checkouts:
                runs = [_run(case, checkout) for _ in range(args.runs)]
                seconds = statistics.median(r[0] for r in runs)
                _, code, err = runs[-1]
                lines = len([line for line in err.splitlines() if line.strip()])
                print(
                    f"{name:<26} {label:<8} {seconds:8.2f} {seconds / torch_s:8.2f} {code:5d} {lines}"
                )


if __name__ == "__main__":
    main()
