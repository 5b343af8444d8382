"""Result files that are either complete or left as they were (``--output``, ``--json``).

Opening a result file for writing truncates it first: a full disk, a quota or a kill
mid-write destroys the previous results and leaves a few kilobytes of invalid JSON.
:func:`write_text_atomic` writes to a temporary file in the target's own folder,
fsyncs it and ``os.replace``\\ s it onto the name (atomic on POSIX within one
filesystem): a reader sees the old file or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


def _default_mode(path: Path) -> int:
    """The file's current permissions, or what ``open()`` would give a new file (0666 - umask)."""
    with contextlib.suppress(OSError):
        return stat.S_IMODE(path.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; create missing parent folders.

    Raises:
        OSError: the folder cannot be written or the disk is full; the message names
            ``path`` and says that a previous file of that name is intact.
    """
    path = Path(path)
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    mode = _default_mode(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # mkstemp creates 0600; results are shared like any file
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):
            kept = "the previous file is intact" if path.exists() else "nothing was written"
            reason = err.strerror or type(err).__name__
            raise OSError(err.errno, f"could not write {path} ({reason}); {kept}") from err
        raise
    return path
