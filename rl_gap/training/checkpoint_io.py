"""Checkpoint files that are either complete or absent, on any local or shared filesystem.

Lightning's default ``TorchCheckpointIO`` writes through an fsspec transaction: the
bytes go to a temporary file under ``$TMPDIR`` and are moved to the checkpoint's name
at commit. When ``$TMPDIR`` and the run folder are on different filesystems (local
``/tmp`` and shared scratch, a docker volume), the move is a truncate-then-copy of the
final file: a kill or a full disk during the copy leaves a 0-byte or partial
``last.ckpt`` under its final name, and a small ``$TMPDIR`` fails the first checkpoint.

:class:`AtomicCheckpointIO` writes every checkpoint to a temporary file in the
checkpoint's *own* folder, flushes and fsyncs it, and ``os.replace``\\ s it onto the
final name (atomic on POSIX within one filesystem), then fsyncs the folder. The
previous file of that name stays intact until the new one is complete. ``rl-gap fit``
installs it in every trainer (unless the recipe sets its own ``CheckpointIO``);
``Trainer(plugins=[AtomicCheckpointIO()])`` does the same in Python. Remote paths
(``s3://``, ``gs://``) keep Lightning's object-store upload, which is atomic there.

:func:`readable_checkpoint_error` says whether a file is a loadable checkpoint, for
``--ckpt_path last`` to skip a damaged one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO

TEMP_PREFIX = ".rl_gap-partial-"  # temporary checkpoints: hidden, never matched by *.ckpt
TEMP_SUFFIX = ".tmp"


@runtime_checkable
class Stateful(Protocol):
    """A loader whose position is saved with the checkpoint: what Lightning's combined loader
    saves and restores (it asks the same two methods of each training loader)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def _is_local(path: str | Path) -> bool:
    fs = get_filesystem(str(path))
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (the folder entry), where the OS allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (full disk, write error); the message is one line."""


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save(obj, path)`` via a fsynced temporary file in ``path``'s folder + ``os.replace``.

    Raises:
        OSError: the folder cannot be written or the disk is full; the message names
            the checkpoint and says that a previous file of that name is intact.
    """
    path = Path(path)
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=TEMP_PREFIX + path.name + ".", suffix=TEMP_SUFFIX)
    try:
        # mkstemp creates 0600; a checkpoint gets the permissions of any file the user writes
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        reason = _write_failure(err)
        if reason is not None:
            kept = "the previous file is intact" if path.exists() else "nothing was written"
            errno_ = err.errno if isinstance(err, OSError) else errno.ENOSPC
            message = f"could not write checkpoint {path} ({reason}); {kept}"
            raise CheckpointWriteError(errno_, message) from err
        raise
    _fsync_folder(folder)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_failure(err: BaseException) -> str | None:
    """Why a checkpoint write failed, if it was the file system; None for anything else.

    ``torch.save`` reports a full disk or a write error of its zip writer as a
    ``RuntimeError`` from ``inline_container.cc`` ("file write failed") rather than an
    ``OSError``; both become the same one-line message.
    """
    if isinstance(err, OSError):
        return err.strerror or type(err).__name__
    text = str(err)
    if isinstance(err, RuntimeError) and ("inline_container" in text or "write failed" in text):
        return "the file system refused the write: is the disk full?"
    return None


def remove_partial_checkpoints(folder: str | Path) -> list[Path]:
    """Delete temporary files left in ``folder`` by a checkpoint write that was killed.

    Only safe while no other process writes checkpoints into ``folder`` (``rl-gap fit``
    holds the run folder's lock). Returns the removed paths.
    """
    folder = Path(folder)
    removed = []
    for tmp in folder.glob(f"{TEMP_PREFIX}*{TEMP_SUFFIX}") if folder.is_dir() else []:
        with contextlib.suppress(OSError):
            tmp.unlink()
            removed.append(tmp)
    return removed


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves are atomic in the checkpoint's own folder."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if not _is_local(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(
                "`Trainer.save_checkpoint(..., storage_options=...)` with `storage_options` arg"
                f" is not supported for `{type(self).__name__}`."
            )
        atomic_torch_save(checkpoint, path)


def readable_checkpoint_error(path: str | Path) -> str | None:
    """None if ``path`` loads as a Lightning checkpoint, else the reason (one line)."""
    from rl_gap.training.run_config import load_checkpoint_file

    try:
        load_checkpoint_file(path)
    except (FileNotFoundError, ValueError) as err:
        return str(err).split(". Pass", 1)[0]
    return None
