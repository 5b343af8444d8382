"""A stop request (SIGTERM, Ctrl-C) recorded from the first moment, in every process of a run.

A cluster stops a job by sending SIGTERM to some or all of its processes, in any
order: the launcher, the ranks, their DataLoader workers, possibly while the job is
still starting. This module holds the pieces that need no torch or Lightning
(imported by ``rl-gap`` before anything heavy):

- :func:`listen_for_sigterm`: from then on a SIGTERM to this process is *recorded*
  (:func:`stop_requested`) instead of killing it; the training callback
  (:class:`rl_gap.training.fault_tolerance.FaultTolerance`) acts on it at the next
  step boundary, or before the first step when it arrived during start-up;
- :func:`die_with_launcher`: a rank started by ``rl-gap``'s launcher (``strategy: ddp``
  or ``ddp_spawn``) is killed by the kernel when the launcher dies, so no rank is ever
  left running without it (Linux ``PR_SET_PDEATHSIG``);
- :class:`ShieldedWorkerInit`: a DataLoader worker outlives a SIGTERM sent by anyone
  but its parent (a ``kill`` of the whole process tree), so the training process can
  still save; it leaves when its parent shuts it down or dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

LAUNCHER_PID_ENV = "RL_GAP_LAUNCHER_PID"  # set by the launcher for the ranks it starts
_PR_SET_PDEATHSIG = 1

_requested: dict[str, int | None] = {"signum": None}
# a counter shared with the ddp_spawn launcher: how many of its workers reached training
_training_started: dict[str, Any] = {"counter": None, "counted": False}


def _record(signum: int, frame: Any) -> None:
    # only a flag: a handler runs between two bytecodes of whatever the process does
    if _requested["signum"] is None:
        _requested["signum"] = signum


def stop_requested() -> int | None:
    """The signal number of the first recorded stop request (SIGTERM/SIGINT), else None."""
    return _requested["signum"]


def request_stop(signum: int) -> None:
    """Record a stop request (what the handler does; also for other handlers to share it)."""
    _record(signum, None)


def clear_stop_request() -> None:
    """Forget a recorded request (a new command in the same process starts clean)."""
    _requested["signum"] = None


def listen_for_sigterm() -> None:
    """Record SIGTERM from now on instead of dying of it (main thread; other handlers kept)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _record)


def is_launched_rank(environ: dict[str, str] | None = None) -> bool:
    """Whether this process is a rank that ``rl-gap``'s launcher started (not the launcher)."""
    env = os.environ if environ is None else environ
    launcher = env.get(LAUNCHER_PID_ENV)
    return bool(launcher) and launcher != str(os.getpid())


def die_with_launcher() -> None:
    """In a rank started by ``rl-gap``'s launcher: die (SIGKILL) when the launcher dies.

    If the launcher is already gone (it died while this process started), exit at once.
    No effect elsewhere, or off Linux.
    """
    if not is_launched_rank() or not sys.platform.startswith("linux"):
        return
    launcher = int(os.environ[LAUNCHER_PID_ENV])
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != launcher:
        sys.stderr.write("rl-gap: the launcher process is gone; this rank stops\n")
        os._exit(128 + signal.SIGTERM)


def run_spawned_rank(started: Any, function: Callable[..., Any], *args: Any) -> Any:
    """A ddp_spawn worker's entry: die with the launcher, record SIGTERM, then run ``function``.

    ``started`` (a shared integer) counts the workers that reached training
    (:func:`note_training_started`). Light on imports: the worker runs it before torch
    or Lightning are loaded, so a SIGTERM is recorded from its first moments.
    """
    die_with_launcher()
    listen_for_sigterm()
    _training_started.update(counter=started, counted=False)
    return function(*args)


def note_training_started() -> None:
    """Called once training is about to start (no effect outside a ddp_spawn worker).

    The launcher reads the count when it is signalled: until every worker is counted,
    nothing can have been trained, so it stops the workers after a short grace instead
    of waiting for a save that cannot come.
    """
    counter = _training_started["counter"]
    if counter is None or _training_started["counted"]:
        return
    with counter.get_lock():
        counter.value += 1
    _training_started["counted"] = True


# ------------------------------------------------------------ DataLoader workers
def _watch_sigterm(parent: int) -> None:
    while True:
        info = signal.sigwaitinfo({signal.SIGTERM})
        if info.si_pid == parent or os.getppid() != parent:
            # the DataLoader shutting its workers down (or an orphan): leave quietly,
            # as torch's own worker handler does for its parent's SIGTERM
            os._exit(0)
        # anyone else (a kill of the whole process tree): keep serving the parent,
        # which saves at its next step and then shuts this worker down


def shield_worker_from_sigterm() -> None:
    """Called in a DataLoader worker: SIGTERM from anyone but the parent is ignored.

    SIGTERM is blocked in the worker and taken by a watcher thread that knows the
    sender: the parent's (the DataLoader shutting its workers down) ends the worker,
    any other is dropped. A worker whose parent dies still ends through torch's
    own watchdog.
    """
    if not hasattr(signal, "sigwaitinfo"):
        return
    parent = os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Thread(target=_watch_sigterm, args=(parent,), daemon=True).start()


class ShieldedWorkerInit:
    """``worker_init_fn`` that shields the worker from SIGTERM, then runs ``inner`` (if any)."""

    def __init__(self, inner: Callable[[int], Any] | None = None) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        if multiprocessing.parent_process() is not None:  # a real worker process
            shield_worker_from_sigterm()
        if self.inner is not None:
            self.inner(worker_id)
