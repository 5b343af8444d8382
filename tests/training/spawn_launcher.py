"""A stand-in for Lightning's ddp_spawn launcher, run as a script by ``test_signals.py``.

``python -m tests.training.spawn_launcher OUT [--hold-lock]`` starts two spawned workers
under :func:`rl_gap.training.signals._spawn_launch`, exactly as Lightning's launcher does
(``torch.multiprocessing.start_processes`` with ``join=False``, then ``join`` in a loop).
Each worker starts a child of its own (as a DataLoader worker would), writes
``OUT/worker<i>`` with its PID and its child's PID, and then never reaches training: it
sleeps as a rank blocked in its rendezvous does, with SIGTERM recorded, not acted on.
The launcher writes ``OUT/started`` once ``start_processes`` returned; with
``--hold-lock`` it holds the run lock of ``OUT/run`` as ``rl-gap fit`` does. With
``--stall-second-start`` the second worker stalls while it reads its start-up data (the
launcher stays blocked writing it, as it does while a real worker imports Lightning), so
that a test can signal the launcher in the middle of ``start_processes``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from pathlib import Path


class _Passed:
    def __setstate__(self, padding: bytes) -> None:
        pass


def _stall_after_the_first(out: str) -> _Passed:
    """Unpickled in each worker: the first passes, the next writes its PID and stalls."""
    try:
        os.close(os.open(Path(out, "first_start"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        Path(out, "stalled").write_text(f"{os.getpid()}\n")
        time.sleep(600)
    return _Passed()


class StallSecondStart:
    """In a worker's start-up data: the second worker to read it stalls (see the module doc)."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.padding = b"x" * (4 << 20)  # more than a pipe holds: the launcher waits on it

    def __reduce__(self):
        return _stall_after_the_first, (self.out,), self.padding


def worker(index: int, out: str, *stall: object) -> None:
    child = subprocess.Popen(["sleep", "600"])
    Path(out, f"worker{index}").write_text(f"{os.getpid()} {child.pid}\n")
    while True:  # a rank stuck before training: the recorded SIGTERM is never acted on
        time.sleep(0.1)


def main(out: str, hold_lock: bool, stall: bool) -> None:
    import torch.multiprocessing as mp

    from rl_gap.training.run_lock import RunLock
    from rl_gap.training.signals import _spawn_launch

    lock = RunLock(Path(out, "run")).acquire() if hold_lock else None
    launcher = types.SimpleNamespace(procs=[])
    try:
        with _spawn_launch(launcher):
            args = (out, StallSecondStart(out)) if stall else (out,)
            context = mp.start_processes(worker, args=args, nprocs=2, join=False,
                                         start_method="spawn")  # fmt: skip
            launcher.procs = context.processes
            Path(out, "started").write_text(f"{os.getpid()}\n")
            while not context.join():
                pass
    finally:
        if lock is not None:
            lock.release()


if __name__ == "__main__":
    main(sys.argv[1], "--hold-lock" in sys.argv[2:], "--stall-second-start" in sys.argv[2:])
