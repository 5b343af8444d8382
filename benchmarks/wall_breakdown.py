"""Where an ``rl-gap`` command's wall time goes: on a CPU, waiting for one, or blocked.

    python benchmarks/wall_breakdown.py predict --config recipe.yaml --ckpt_path last.ckpt
    python benchmarks/wall_breakdown.py evaluate --queries q.npy --quiet

Runs the command in this process and reads the main thread's scheduler statistics
(``/proc/thread-self/schedstat``, Linux): wall time = time on a CPU + time runnable but
waiting for a CPU (other processes' load) + time blocked (sleeps, polls, I/O, waiting
for child processes or other threads). A command that sleeps or polls shows it in the
last column whatever the machine's load; on a loaded machine the middle column is
what separates wall time from CPU time. Two phases: importing ``rl_gap.training.cli``
(torch, Lightning, torchmetrics) and the rest of the command. Prints to stderr.
"""

from __future__ import annotations

import sys
import time


def _sched() -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting) of the calling thread."""
    with open("/proc/thread-self/schedstat") as f:
        run, wait, _ = f.read().split()
    return int(run) / 1e9, int(wait) / 1e9


def _line(name: str, wall: float, run: float, wait: float) -> str:
    blocked = wall - run - wait
    return (
        f"{name:<28} wall {wall:7.2f} s = on CPU {run:6.2f} + waiting for a CPU {wait:6.2f}"
        f" + blocked {blocked:6.2f}"
    )


def main(argv: list[str]) -> int:
    t0, (r0, w0) = time.perf_counter(), _sched()
    import rl_gap.training.cli  # noqa: F401  (the heavy imports, timed apart)

    t1, (r1, w1) = time.perf_counter(), _sched()
    from rl_gap.cli import main as rl_gap_main

    code = 0
    try:
        code = rl_gap_main(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    t2, (r2, w2) = time.perf_counter(), _sched()
    rows = [
        ("imports (training CLI)", t1 - t0, r1 - r0, w1 - w0),
        ("the rest of the command", t2 - t1, r2 - r1, w2 - w1),
        ("total", t2 - t0, r2 - r0, w2 - w0),
    ]
    for row in rows:
        print(_line(*row), file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
