"""Optional C++ helpers built on first use and loaded with ctypes.

A helper is one ``.cpp`` file with a plain C ABI (no torch headers), so it
compiles with the system compiler in about a second (torch's ``load_inline``
takes ~50 s here). The shared library is cached under ``$RL_GAP_CACHE``, else
``$XDG_CACHE_HOME/rl_gap``, else ``~/.cache/rl_gap``, named by a hash of its
source, the local headers it includes (``#include "name.h"``, found next to it)
and its flags, so an edited source or header, or another compiler, builds afresh. One
process per machine compiles it: the build holds an exclusive ``fcntl`` lock on
``<library>.lock`` and renames the finished file into place, so concurrent
processes (DDP ranks, pytest workers) wait for that build and load its result. Built with ``-fopenmp``, it
resolves ``libgomp`` to torch's own copy once torch is imported and shares
torch's worker pool.

``RL_GAP_NATIVE=0`` disables every helper; ``=1`` turns a failed build into an
error (at every use, not only the first); by default a missing compiler or failed build warns once and the caller
falls back to its torch path (which computes the same numbers).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["NativeLibrary", "cache_dir", "BASE_FLAGS"]

# -ffp-contract=off: every product and sum rounded separately, as in torch's ops.
BASE_FLAGS = ("-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-std=c++17")


def cache_dir() -> Path:
    """Where built helpers live: ``$RL_GAP_CACHE``, ``$XDG_CACHE_HOME/rl_gap`` or ``~/.cache/rl_gap``.

    A relative ``XDG_CACHE_HOME`` is ignored, as the XDG base-directory spec says.
    """
    if os.environ.get("RL_GAP_CACHE"):
        return Path(os.environ["RL_GAP_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "rl_gap"


_LOCAL_INCLUDE = re.compile(rb'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def local_includes(source: Path) -> list[Path]:
    """``source`` and the files it includes with quotes, transitively (paths relative to
    the including file, as the compiler looks first), each once, in first-seen order."""
    seen: list[Path] = []
    pending = [Path(source)]
    while pending:
        path = pending.pop(0)
        if path in seen:
            continue
        seen.append(path)
        for name in _LOCAL_INCLUDE.findall(path.read_bytes()):
            pending.append(path.parent / name.decode())
    return seen


class NativeLibrary:
    """One helper: its source, build flags and ctypes declarations.

    Args:
        source: the ``.cpp`` file.
        stem: file-name stem of the built library.
        declare: sets ``argtypes``/``restype`` of the exported functions.
        flags: compiler flags, or a callable returning them at build time.
        what: name used in warnings and errors.
    """

    def __init__(
        self,
        source: Path,
        stem: str,
        declare: Callable[[ctypes.CDLL], None],
        flags: Sequence[str] | Callable[[], Sequence[str]] = BASE_FLAGS,
        what: str = "native helper",
    ) -> None:
        self.source, self.stem, self.declare = Path(source), stem, declare
        self.flags, self.what = flags, what
        self._lock = threading.Lock()
        self._library: ctypes.CDLL | None = None
        self.failure: str | None = None

    def enabled(self) -> bool:
        """Whether the helper may be used (``RL_GAP_NATIVE`` not ``0``, no failed build)."""
        return os.environ.get("RL_GAP_NATIVE", "auto") != "0" and self.failure is None

    def load(self) -> ctypes.CDLL | None:
        """The loaded library (built once per machine and source), or None."""
        if self.failure is not None and os.environ.get("RL_GAP_NATIVE") == "1":
            raise RuntimeError(f"rl_gap {self.what} unavailable: {self.failure}")
        if not self.enabled():
            return None
        with self._lock:
            if self._library is None and self.failure is None:
                try:
                    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
                    if compiler is None:
                        raise RuntimeError("no C++ compiler (set CXX or install g++)")
                    library = ctypes.CDLL(str(self._build(compiler)))
                    self.declare(library)
                    self._library = library
                except Exception as error:  # noqa: BLE001 - any build problem -> torch path
                    self.failure = str(error)
                    if os.environ.get("RL_GAP_NATIVE") == "1":
                        raise RuntimeError(f"rl_gap {self.what} unavailable: {error}") from error
                    warnings.warn(
                        f"rl_gap {self.what} unavailable ({error}); using torch ops", stacklevel=3
                    )
        return self._library

    def _build(self, compiler: str) -> Path:
        flags = list(self.flags() if callable(self.flags) else self.flags)
        source = b"".join(path.read_bytes() for path in local_includes(self.source))
        key = hashlib.sha256(source + " ".join([compiler, *flags]).encode()).hexdigest()[:16]
        target = cache_dir() / f"{self.stem}_{key}.so"
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        # One compile per machine: the other processes wait on the lock, then find the
        # library; building under a private name and renaming means no process ever
        # loads a half-written file.
        with open(target.with_name(target.stem + ".lock"), "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            if target.exists():  # built by another process while this one waited
                return target
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
            os.close(fd)
            try:
                subprocess.run(
                    [compiler, *flags, str(self.source), "-o", tmp],
                    check=True, capture_output=True, text=True, timeout=300,
                )  # fmt: skip
                os.replace(tmp, target)
            except subprocess.CalledProcessError as error:
                raise RuntimeError(f"{compiler} failed: {error.stderr.strip()[-2000:]}") from error
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return target
