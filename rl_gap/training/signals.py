"""SIGTERM to the process that launched a multi-process fit: every process saves and exits 143.

The training processes themselves agree on a SIGTERM at a step boundary
(:class:`rl_gap.training.fault_tolerance.FaultTolerance`: the handler sets a flag,
one collective per step, one save, ``SIGTERMException(143)``). What is left is the
launcher, which is not always a training process:

- ``strategy: ddp`` launched as ``rl-gap fit --trainer.devices N``: the launcher is
  rank 0 and re-runs the command for ranks 1..N-1. Lightning's child-process
  observer kills everything with SIGKILL as soon as a child exits non-zero, so a
  rank that exits 143 after its save would kill rank 0 while it is still stopping;
  :func:`sigterm_safe_launch` makes the observer treat 143 as a normal end, and
  :func:`report_workers_stopped` waits for the ranks and prints their exit statuses.
- ``strategy: ddp_spawn``: the launcher only waits for its workers; a SIGTERM to it
  used to end it at once (-15) and leave the workers running. Here it is forwarded
  to the workers, which save and exit 143; the launcher then exits 143 too.
- ``torchrun``/``srun``: the launcher is theirs; torchrun forwards SIGTERM to the
  ranks (which save and exit 143) and reports their statuses itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

from lightning.fabric.strategies.launchers import subprocess_script as fabric_subprocess
from lightning.pytorch.strategies.launchers import subprocess_script as pl_subprocess
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

SIGTERM_EXIT_CODE = 128 + 15
WAIT_FOR_RANKS_S = 120.0  # how long the launcher waits for ranks that are stopping


class _ObserverAllowingSigtermExit(fabric_subprocess._ChildProcessObserver):
    """Lightning's observer, except that a rank exiting 143 (stopped on SIGTERM) is not a crash."""

    def _run(self) -> bool:
        for proc in self._child_processes:
            proc.poll()
        if any(proc.returncode == SIGTERM_EXIT_CODE for proc in self._child_processes):
            return True  # the ranks are stopping together; the launcher waits for them
        return super()._run()


def _launch_observer(child_processes: list[Any]) -> None:
    _ObserverAllowingSigtermExit(main_pid=os.getpid(), child_processes=child_processes).start()


def _alive_workers(launcher: Any) -> list[Any]:
    return [p for p in getattr(launcher, "procs", []) or [] if p.is_alive()]


@contextlib.contextmanager
def sigterm_safe_launch(launcher: Any) -> Iterator[None]:
    """Run a fit under ``launcher`` so that a SIGTERM to the launcher ends every process with 143."""
    if isinstance(launcher, _SubprocessScriptLauncher):
        original = pl_subprocess._launch_process_observer
        pl_subprocess._launch_process_observer = _launch_observer
        try:
            yield
        finally:
            pl_subprocess._launch_process_observer = original
        return
    if not isinstance(launcher, _MultiProcessingLauncher) or (
        threading.current_thread() is not threading.main_thread()
    ):
        yield
        return

    def forward(signum: int, frame: Any) -> None:
        workers = _alive_workers(launcher)
        if not workers:  # not started yet: nothing was trained, nothing to save
            raise SystemExit(SIGTERM_EXIT_CODE)
        for proc in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def ignoring_sigterm() -> Iterator[None]:
    """SIGTERM ignored inside the block (main thread only), the previous handler back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def report_workers_stopped(launcher: Any) -> None:
    """Wait for the launcher's worker processes to end; print their exit statuses."""
    procs = list(getattr(launcher, "procs", []) or [])
    if not procs:
        return
    codes = []
    for proc in procs:
        if isinstance(proc, subprocess.Popen):
            try:
                codes.append(proc.wait(timeout=WAIT_FOR_RANKS_S))
            except subprocess.TimeoutExpired:  # stuck, e.g. in a collective
                proc.kill()
                codes.append(proc.wait())
        else:  # multiprocessing.Process (ddp_spawn), already joined by the launcher
            proc.join(timeout=WAIT_FOR_RANKS_S)
            codes.append(proc.exitcode)
    sys.stderr.write(
        f"rl-gap: SIGTERM: worker process(es) {[p.pid for p in procs]} exited with {codes}\n"
    )
