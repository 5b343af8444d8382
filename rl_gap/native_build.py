"""Optional C++ helpers built on first use and loaded with ctypes.

A helper is one ``.cpp`` file with a plain C ABI (no torch headers), so it
compiles with the system compiler in about a second (torch's ``load_inline``
takes ~50 s here). The shared library is cached under ``$RL_GAP_CACHE``
(default ``~/.cache/rl_gap``), named by a hash of its source and flags, so an
edited source or another compiler builds afresh. Built with ``-fopenmp``, it
resolves ``libgomp`` to torch's own copy once torch is imported and shares
torch's worker pool.

``RL_GAP_NATIVE=0`` disables every helper; ``=1`` turns a failed build into an
error; by default a missing compiler or failed build warns once and the caller
falls back to its torch path (which computes the same numbers).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
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
    """Where built helpers live: ``$RL_GAP_CACHE`` or ``~/.cache/rl_gap``."""
    return Path(os.environ.get("RL_GAP_CACHE") or Path.home() / ".cache" / "rl_gap")


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
        source = self.source.read_bytes()
        key = hashlib.sha256(source + " ".join([compiler, *flags]).encode()).hexdigest()[:16]
        target = cache_dir() / f"{self.stem}_{key}.so"
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        # Build under a private name, then rename: concurrent processes (DDP ranks)
        # never load a half-written file.
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
