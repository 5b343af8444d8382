"""One run per run folder: an exclusive lock held for the run's lifetime.

Two ``rl-gap fit`` processes writing one run folder (the same command launched
twice, two configurations with the same ``--run_name``) interleave
``metrics.csv``, overwrite each other's ``config.yaml`` and ``last.ckpt`` and
share one W&B id, and both exit 0. :class:`RunLock` takes an exclusive
``fcntl.flock`` on ``<run>/.rl_gap.lock`` and writes the holder's PID, host and
start time into it; a second run refuses with one line naming the holder and
``--run_name`` as the way out.

The kernel drops a ``flock`` when its process dies (also on ``kill -9``), so the
lock of a dead run is taken over without any clean-up. On a filesystem without
``flock`` support the PID in the file decides instead (alive on this host: held).
Under DDP only the process that starts the run takes it (rank 0 / the launcher):
:func:`starts_the_run` is False in the processes a launcher starts for other ranks.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from pathlib import Path

LOCK_NAME = ".rl_gap.lock"

# folders this process holds: a second fit in the same process (a notebook, a test,
# ``trainer.fit`` after ``run=False``) reuses the lock instead of refusing itself
_HELD: dict[Path, RunLock] = {}


class RunFolderLocked(RuntimeError):
    """The run folder is in use by another live process."""


def starts_the_run(environ: dict[str, str] | None = None) -> bool:
    """False in a process that a launcher started for a rank other than 0 (it must not lock)."""
    env = os.environ if environ is None else environ
    return all(env.get(k, "0") == "0" for k in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """Exclusive lock on a run folder (``acquire``/``release``, or a context manager).

    Args:
        folder: the run folder; ``<folder>/.rl_gap.lock`` holds ``pid host start-time``.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None

    def holder(self) -> str:
        """``"PID 123 on host node7 (since 2026-01-01 12:00:00)"`` from the lock file, or ``"?"``."""
        try:
            pid, host, *since = self.path.read_text().split()
        except (OSError, ValueError):
            return "an unknown process"
        started = f" (since {' '.join(since)})" if since else ""
        return f"PID {pid} on host {host}{started}"

    def _refuse(self) -> RunFolderLocked:
        return RunFolderLocked(
            f"run folder {self.folder} is in use by {self.holder()} (lock {self.path}): two runs "
            "in one folder would overwrite each other's metrics, config and checkpoints. Wait "
            "for it to finish, or give this run its own folder with --run_name NAME"
        )

    def acquire(self) -> RunLock:
        key = self.folder.resolve()
        if key in _HELD:
            return _HELD[key]
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._refuse() from None
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise
            self._check_pid_fallback(fd)
        os.ftruncate(fd, 0)
        since = time.strftime("%Y-%m-%d %H:%M:%S")
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {since}\n".encode(), 0)
        with contextlib.suppress(OSError):
            os.fsync(fd)
        self._fd = fd
        _HELD[key] = self
        return self

    def _check_pid_fallback(self, fd: int) -> None:
        """No flock on this filesystem: a live PID of this host in the file holds the folder."""
        try:
            pid, host, *_ = self.path.read_text().split()
            held = host == socket.gethostname() and int(pid) != os.getpid() and _pid_alive(int(pid))
        except (OSError, ValueError):
            held = False
        if held:
            os.close(fd)
            raise self._refuse()

    def release(self) -> None:
        if self._fd is None:
            return
        _HELD.pop(self.folder.resolve(), None)
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        with contextlib.suppress(OSError):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
