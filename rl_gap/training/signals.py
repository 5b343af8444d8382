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
  is forwarded to the workers, which save and exit 143; the launcher then exits 143
  too (it would otherwise die at once and leave the workers running).
- ``torchrun``/``srun``: the launcher is theirs; torchrun forwards SIGTERM to the
  ranks (which save and exit 143) and reports their statuses itself.

Start-up is covered too (the rule: whoever is signalled, the job saves once and exits
143, or, when nothing was trained yet, every process stops promptly and the run lock
is released only after the last one): the ranks record a SIGTERM from their first
moments (:mod:`rl_gap.training.stop_request`) and die with the launcher
(``PR_SET_PDEATHSIG``); under ``ddp`` a rank killed while starting makes the launcher
stop every process with 143. Under ``ddp_spawn`` the launcher knows how many workers
reached training (a shared count, :func:`~rl_gap.training.stop_request.note_training_started`);
signalled before all did, it cuts the start short or, once the workers exist, passes
the SIGTERM on and kills what is left after ``STARTUP_GRACE_S`` seconds (a worker still
starting can be blocked in the rendezvous with one that died, and torch would wait
twice 30 s), waits for them and exits 143. A worker that dies while the launcher starts
the others (which would otherwise block for ever writing its start-up data) has the
same effect.
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
    request_stop,
    run_spawned_rank,
    stop_requested,
)

SIGTERM_EXIT_CODE = 128 + 15
STOP_EXIT_CODES = (128 + 15, 128 + 2)  # a rank stopped on SIGTERM / Ctrl-C after saving
WAIT_FOR_RANKS_S = 120.0  # how long the launcher waits for ranks that are stopping
STARTUP_GRACE_S = 3.0  # ddp_spawn workers signalled before training: killed after this


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
    """The workers' start is cut short: a stop request, or a worker died while starting."""


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


def _process_table() -> dict[int, list[int]]:
    """Parent PID -> child PIDs of every process (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # not a process, or gone meanwhile
        children.setdefault(ppid, []).append(int(entry))
    return children


def _children(pid: int) -> set[int]:
    return set(_process_table().get(pid, []))


def _kill_trees(pids: list[int]) -> None:
    """SIGKILL each process in ``pids`` with all its descendants."""
    table, todo, doomed = _process_table(), list(pids), []
    while todo:
        pid = todo.pop()
        doomed.append(pid)
        todo += table.get(pid, [])
    for pid in doomed:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _stopped_before_training(signum: int, workers: list[int], when: str) -> SystemExit:
    stopped = f"; worker process(es) {sorted(workers)} stopped" if workers else ""
    sys.stderr.write(
        f"rl-gap: {signal.Signals(signum).name} {when}: nothing was trained{stopped}\n"
    )
    sys.stderr.flush()
    return SystemExit(128 + signum)


def _stop_workers_before_training(workers: list[Any], started: Any, signum: int) -> None:
    """The launcher was signalled before every worker reached training: stop them all promptly.

    The workers were sent SIGTERM; one still starting may be blocked in the rendezvous with
    one that died of it, and torch would wait twice 30 s before killing it. Nothing was
    trained, so after ``STARTUP_GRACE_S`` the workers and their own children are killed and
    reaped, and the launcher exits ``128 + signum`` (the run lock is released after that).
    Returns without stopping anything when every worker reached training meanwhile.
    """
    deadline = time.monotonic() + STARTUP_GRACE_S
    while time.monotonic() < deadline and any(p.is_alive() for p in workers):
        if started.value >= len(workers):
            return  # all of them train: they agree on the stop, save and exit together
        time.sleep(0.05)
    if started.value >= len(workers):
        return
    _kill_trees([p.pid for p in workers if p.is_alive()])
    for proc in workers:
        proc.join(timeout=WAIT_FOR_RANKS_S)
    raise _stopped_before_training(signum, [p.pid for p in workers], "before training started")


@contextlib.contextmanager
def _spawn_launch(launcher: Any) -> Iterator[None]:
    started: list[Any] = []
    starting, aborted, stopping = [False], [False], [False]
    trained: Any = None  # shared with the workers: how many reached training

    def pass_on() -> None:
        for proc in [p for p in started or _alive_workers(launcher) if p.is_alive()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)

    def stop(signum: int) -> None:
        workers = started or list(getattr(launcher, "procs", []) or [])
        if stopping[0] or not workers or trained is None:
            return  # acted on already, or once the workers exist
        stopping[0] = True
        pass_on()
        _stop_workers_before_training(workers, trained, signum)

    def forward(signum: int, frame: Any) -> None:
        # the launcher trains nothing: record, pass the stop on to the workers (SIGTERM
        # even for Ctrl-C: their first signal decides their exit status); while workers
        # are being started nothing can have been trained: the start is cut short
        if not (starting[0] and aborted[0]):  # (not the start watcher's own wake-up)
            request_stop(signum)
        if starting[0]:
            raise _StartAborted
        stop(signum)

    original_start = mp.start_processes

    def start_processes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        nonlocal trained
        signum = stop_requested()
        if signum is not None:  # signalled before any worker exists: none is started
            raise _stopped_before_training(signum, [], "before the workers were started")
        trained = multiprocessing.get_context(kwargs.get("start_method", "spawn")).Value("i", 0)
        before = _children(os.getpid())  # the workers are the children started from here
        starting[0] = True
        watch = threading.Thread(
            target=_watch_start, args=(starting, aborted, threading.get_ident()), daemon=True
        )
        watch.start()
        try:
            context = original_start(
                functools.partial(run_spawned_rank, trained, fn), *args, **kwargs
            )
            started[:] = context.processes
        except _StartAborted:
            # the worker being started is not a multiprocessing child yet: found by its PID
            starting[0] = False
            workers = sorted(_children(os.getpid()) - before)
            _kill_trees(workers)
            joined = multiprocessing.active_children()
            for proc in joined:
                proc.join(timeout=WAIT_FOR_RANKS_S)
            for pid in set(workers) - {p.pid for p in joined}:  # reaped by nobody else
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            signum = stop_requested()
            if signum is None:
                sys.stderr.write(
                    "rl-gap: a worker died while the workers were starting (signalled?): "
                    "nothing was trained; every worker stopped\n"
                )
                raise SystemExit(SIGTERM_EXIT_CODE) from None
            raise _stopped_before_training(
                signum, workers, "while the workers were starting"
            ) from None
        finally:
            starting[0] = False
        signum = stop_requested()
        if signum is not None:
            stop(signum)
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
