"""Start-up time of ``rl-gap`` commands and imports, with ``python -X importtime`` detail.

    python benchmarks/bench_startup.py                       # this checkout, 3 runs each
    python benchmarks/bench_startup.py --before /work/main   # the same figures for another checkout
    python benchmarks/bench_startup.py --importtime "fit --help" --top 15

Each figure is the median wall time of fresh processes (``python -m rl_gap.cli ...``
or ``python -c "import ..."``). ``--help`` runs three ways: "live" with replay and
cache off (``RL_GAP_HELP_CACHE=0``: every import paid), "fresh install" with the
help spec that the install records (:mod:`rl_gap.help_spec`, built here once before
the runs) and an empty help cache, and "repeat" with the cache written by the previous
call (:mod:`rl_gap.help_spec.pages`). The last column divides "fresh install" by
``import torch`` measured in the same run, which makes figures from a loaded
machine comparable. "rl_gap.losses beyond torch" is the cumulative
``-X importtime`` of ``rl_gap.losses`` imported after ``torch`` (what the package
adds). ``--importtime`` lists the top-level packages with the largest cumulative
import time for one command (nested packages are counted inside their importer).
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

CASES = {
    "import torch": ["-c", "import torch"],
    "import rl_gap.losses": ["-c", "import rl_gap.losses"],
    "import lightning": ["-c", "import lightning"],
    "rl-gap --help": ["-m", "rl_gap.cli", "--help"],
    "rl-gap fit --help": ["-m", "rl_gap.cli", "fit", "--help"],
    "rl-gap extrapolate --help": ["-m", "rl_gap.cli", "extrapolate", "--help"],
}


def _env(checkout: Path, cache: str | None, spec: str | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "WANDB_MODE": "offline"}
    env.pop("RL_GAP_HELP_SPEC", None)
    if cache is None:
        env["RL_GAP_HELP_CACHE"] = "0"
    else:
        env["RL_GAP_CACHE"] = cache
        env.pop("RL_GAP_HELP_CACHE", None)
    if spec is not None:
        env["RL_GAP_HELP_SPEC"] = spec
    return env


def _run(args: list[str], checkout: Path, cache: str | None, spec: str | None = None) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=checkout,
        env=_env(checkout, cache, spec),
        capture_output=True,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed in {checkout}: {proc.stderr.decode()[-500:]}")
    return elapsed


def _record_spec(checkout: Path, spec: str) -> bool:
    """Record the help spec as an install does; False for a checkout without rl_gap.help_spec."""
    proc = subprocess.run(
        [sys.executable, "-m", "rl_gap.help_spec", "--out", spec],
        cwd=checkout,
        env=_env(checkout, os.path.dirname(spec)),
        capture_output=True,
    )
    return proc.returncode == 0


def measure(checkout: Path, repeats: int) -> dict[str, dict[str, float]]:
    """{case: {"live": s, "fresh": s, "repeat": s}} medians; imports have "fresh" only."""
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        spec = os.path.join(tmp, "help_spec.json")
        if not _record_spec(checkout, spec):
            spec = os.path.join(tmp, "absent.json")
        for name, args in CASES.items():
            if "--help" not in args:
                figures[name] = {"fresh": statistics.median(
                    _run(args, checkout, None) for _ in range(repeats)
                )}  # fmt: skip
                continue
            live = [_run(args, checkout, None) for _ in range(repeats)]
            caches = [os.path.join(tmp, f"{name}-{i}") for i in range(repeats)]
            fresh = [_run(args, checkout, cache, spec) for cache in caches]
            repeat = [_run(args, checkout, caches[0], spec) for _ in range(repeats)]
            figures[name] = {
                "live": statistics.median(live),
                "fresh": statistics.median(fresh),
                "repeat": statistics.median(repeat),
            }
    return figures


def importtime_rows(args: list[str], checkout: Path) -> list[tuple[float, str]]:
    """(cumulative s, module as printed, indentation kept) of ``python -X importtime args``."""
    proc = subprocess.run(  # help replay and cache off: the imports happen
        [sys.executable, "-X", "importtime", *args],
        cwd=checkout,
        env=_env(checkout, None),
        capture_output=True,
        text=True,
    )
    rows = []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, module = line.split("|", 2)
            if cumulative.strip().isdigit():
                rows.append((int(cumulative) / 1e6, module.rstrip()))
    return rows


def importtime_top(command: str, checkout: Path, top: int) -> list[tuple[float, str]]:
    """The ``top`` top-level packages by cumulative import time (s) of ``command`` (a CASES
    key without the ``rl-gap`` prefix, e.g. ``fit --help``, or ``import x``)."""
    if command.startswith("import "):
        args = ["-c", command]
    else:
        args = ["-m", "rl_gap.cli", *command.split()]
    rows = [(t, m.strip()) for t, m in importtime_rows(args, checkout) if "." not in m]
    return sorted(rows, reverse=True)[:top]


def losses_beyond_torch(checkout: Path) -> float:
    """Cumulative import time (s) of ``rl_gap.losses`` once torch is imported."""
    rows = importtime_rows(["-c", "import torch; import rl_gap.losses"], checkout)
    return next(t for t, m in rows if m.strip() == "rl_gap.losses")


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [
        "| checkout | command | live s | fresh install s | repeat s | fresh / import torch |",
        "|---|---|---|---|---|---|",
    ]
    for label, figures in results.items():
        torch_s = figures["import torch"]["fresh"]
        for name, f in figures.items():
            live, repeat = (f"{f[k]:.2f}" if k in f else "-" for k in ("live", "repeat"))
            lines.append(
                f"| {label} | `{name}` | {live} | {f['fresh']:.2f} | {repeat} "
                f"| {f['fresh'] / torch_s:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--before", type=Path, help="another checkout to measure the same way")
    parser.add_argument("--importtime", help="command for the -X importtime listing")
    parser.add_argument("--top", type=int, default=12, help="modules in that listing")
    args = parser.parse_args()
    results = {}
    if args.before:
        results[f"before ({args.before})"] = measure(args.before.resolve(), args.repeats)
    results[f"this ({ROOT})"] = measure(ROOT, args.repeats)
    print(table(results))
    checkouts = ([("before", args.before.resolve())] if args.before else []) + [("this", ROOT)]
    for label, checkout in checkouts:
        print(f"\nrl_gap.losses beyond torch ({label}): {losses_beyond_torch(checkout):.3f} s")
    if args.importtime:
        for label, checkout in checkouts:
            print(f"\n`python -X importtime` of {args.importtime!r} ({label}): cumulative s")
            for seconds, module in importtime_top(args.importtime, checkout, args.top):
                print(f"  {seconds:7.2f}  {module}")


if __name__ == "__main__":
    main()
