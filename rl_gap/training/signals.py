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

Start-up is covered too (the rule: whoever is signalled, the job saves once and exits
143, or, when nothing was trained yet, every process stops promptly and the run lock
is released only after the last one): the ranks record a SIGTERM from their first
moments (:mod:`rl_gap.training.stop_request`) and die with the launcher
(``PR_SET_PDEATHSIG``); under ``ddp`` a rank killed while starting makes the launcher
stop every process with 143; under ``ddp_spawn`` a stop that reaches the launcher while
it starts the workers is passed on once all of them exist, and a worker that dies
while starting (the launcher would otherwise block for ever writing its start-up data)
makes the launcher stop them all and exit 143.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch.multiprocessing as mp
from lightning.fabric.strategies.launchers import subprocess_script as fabric_subprocess
from lightning.pytorch.strategies.launchers import subprocess_script as pl_subprocess
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

from rl_gap.training.stop_request import (
    LAUNCHER_PID_ENV,
    die_with_launcher,
    listen_for_sigterm,
    request_stop,
    stop_requested,
)

SIGTERM_EXIT_CODE = 128 + 15
STOP_EXIT_CODES = (128 + 15, 128 + 2)  # a rank stopped on SIGTERM / Ctrl-C after saving
WAIT_FOR_RANKS_S = 120.0  # how long the launcher waits for ranks that are stopping


class _ObserverAllowingSigtermExit(fabric_subprocess._ChildProcessObserver):
    """Lightning's observer, except that a rank stopping on a signal is not a crash.

    A rank that exits 143/130 saved with the others (the launcher waits for them); a
    rank killed by SIGTERM/SIGINT itself was signalled while it was starting, before it
    could record the signal: nothing was trained, so every process stops at once
    (the other ranks are killed, the launcher exits 143), without a rank left behind.
    """

    def _run(self) -> bool:
        for proc in self._child_processes:
            proc.poll()
        codes = [proc.returncode for proc in self._child_processes]
        if any(code in STOP_EXIT_CODES for code in codes):
            return True  # the ranks are stopping together; the launcher waits for them
        if any(code in (-signal.SIGTERM, -signal.SIGINT) for code in codes):
            for proc in self._child_processes:
                with contextlib.suppress(OSError):
                    proc.kill()
            for proc in self._child_processes:
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    proc.wait(timeout=WAIT_FOR_RANKS_S)
            sys.stderr.write(
                f"rl-gap: a rank was stopped by a signal while starting (statuses {codes}); "
                "nothing was trained, every process stopped\n"
            )
            sys.stderr.flush()
            os._exit(SIGTERM_EXIT_CODE)
        return super()._run()


def _launch_observer(child_processes: list[Any]) -> None:
    _ObserverAllowingSigtermExit(main_pid=os.getpid(), child_processes=child_processes).start()


def _alive_workers(launcher: Any) -> list[Any]:
    return [p for p in getattr(launcher, "procs", []) or [] if p.is_alive()]


def _rank_entry(function: Callable[..., Any], *args: Any) -> Any:
    """A ddp_spawn worker: die with the launcher, record SIGTERM from the start, then run."""
    die_with_launcher()
    listen_for_sigterm()
    return function(*args)


@contextlib.contextmanager
def _launcher_pid_for_ranks() -> Iterator[None]:
    previous = os.environ.get(LAUNCHER_PID_ENV)
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(LAUNCHER_PID_ENV, None)
        else:
            os.environ[LAUNCHER_PID_ENV] = previous


@contextlib.contextmanager
def _script_launch(launcher: Any) -> Iterator[None]:
    original_observer = pl_subprocess._launch_process_observer
    pl_subprocess._launch_process_observer = _launch_observer
    # the launcher is rank 0: its SIGTERM handler only records (FaultTolerance acts on it)
    try:
        with _launcher_pid_for_ranks():
            yield
        wait_for_workers(launcher)  # the run lock is released only after every rank ended
    finally:
        pl_subprocess._launch_process_observer = original_observer


class _StartAborted(Exception):
    """A worker died while the launcher was starting the workers (after a stop request)."""


def _watch_start(starting: list[bool], aborted: list[bool], main_thread: int) -> None:
    # A spawned worker reads its start-up data from a pipe whose read end the launcher
    # also holds until it has written everything: a worker killed during its start
    # (a SIGTERM to it or to the whole tree) leaves the launcher blocked in that write
    # for ever. A dead child interrupts the start (the launcher's handler raises).
    while starting[0]:
        try:
            dead = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            dead = None
        if dead is not None:
            aborted[0] = True
            signal.pthread_kill(main_thread, signal.SIGTERM)
            return
        time.sleep(0.1)


def _kill_started_workers() -> None:
    for proc in multiprocessing.active_children():
        with contextlib.suppress(OSError):
            proc.kill()
        proc.join(timeout=WAIT_FOR_RANKS_S)


@contextlib.contextmanager
def _spawn_launch(launcher: Any) -> Iterator[None]:
    started: list[Any] = []
    starting = [False]

    def pass_on() -> None:
        for proc in [p for p in started or _alive_workers(launcher) if p.is_alive()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)

    aborted = [False]

    def forward(signum: int, frame: Any) -> None:
        # the launcher trains nothing: record, pass the stop on to the workers (SIGTERM
        # even for Ctrl-C: their first signal decides their exit status); while workers
        # are being started, wait until all exist, unless one died while starting
        if starting[0] and aborted[0]:
            raise _StartAborted
        request_stop(signum)
        if not starting[0]:
            pass_on()

    original_start = mp.start_processes

    def start_processes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        starting[0] = True  # a stop now is passed on once every worker exists
        watch = threading.Thread(
            target=_watch_start, args=(starting, aborted, threading.get_ident()), daemon=True
        )
        watch.start()
        try:
            context = original_start(functools.partial(_rank_entry, fn), *args, **kwargs)
            started[:] = context.processes
        except _StartAborted:
            starting[0] = False
            _kill_started_workers()
            sys.stderr.write(
                "rl-gap: a worker died while the workers were starting (signalled?): nothing "
                "was trained; every worker stopped\n"
            )
            raise SystemExit(SIGTERM_EXIT_CODE) from None
        finally:
            starting[0] = False
        if stop_requested() is not None:
            pass_on()
        return context

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    mp.start_processes = start_processes
    try:
        with _launcher_pid_for_ranks():
            yield
    finally:
        mp.start_processes = original_start
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def sigterm_safe_launch(launcher: Any) -> Iterator[None]:
    """Run a fit under ``launcher`` so that a SIGTERM to any of its processes ends all with 143."""
    if threading.current_thread() is not threading.main_thread():
        yield
    elif isinstance(launcher, _SubprocessScriptLauncher):
        with _script_launch(launcher):
            yield
    elif isinstance(launcher, _MultiProcessingLauncher):
        with _spawn_launch(launcher):
            yield
    else:
        yield


def wait_for_workers(launcher: Any, timeout: float = WAIT_FOR_RANKS_S) -> list[int | None]:
    """Wait for the launcher's worker processes (killed after ``timeout``); their statuses."""
    codes = []
    for proc in list(getattr(launcher, "procs", []) or []):
        if isinstance(proc, subprocess.Popen):
            try:
                codes.append(proc.wait(timeout=timeout))
            except subprocess.TimeoutExpired:  # stuck, e.g. in a collective
                proc.kill()
                codes.append(proc.wait())
        else:  # multiprocessing.Process (ddp_spawn)
            proc.join(timeout=timeout)
            if proc.is_alive():
                proc.kill()
                proc.join()
            codes.append(proc.exitcode)
    return codes


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
    codes = wait_for_workers(launcher)
    sys.stderr.write(
        f"rl-gap: SIGTERM: worker process(es) {[p.pid for p in procs]} exited with {codes}\n"
    )
