"""The checkpoints a run folder holds: the newest one that loads, and the refusal type.

The bottom of the resume checks: :mod:`rl_gap.training.resume`,
:mod:`rl_gap.training.run_checkpoint` and :mod:`rl_gap.training.run_folder` all read
checkpoints through :func:`newest_readable_checkpoint` and refuse with
:class:`ResumeRefused`; this module imports none of them.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from rl_gap.training.run_config import load_checkpoint_file

__all__ = ["ResumeRefused", "newest_readable_checkpoint"]


class ResumeRefused(ValueError):
    """``--ckpt_path`` names nothing this run can resume (the message says why and what to do)."""


def newest_readable_checkpoint(
    folder: Path, extra: list[Path] | None = None
) -> tuple[Path, dict[str, Any]] | None:
    """``--ckpt_path last``: the newest ``last*.ckpt`` if it loads, else the newest ``*.ckpt`` that does.

    ``extra``: more candidates ranked with ``last*.ckpt`` (Lightning's ``hpc_ckpt_<n>.ckpt``,
    written at the same moments: before a requeue). A damaged file (0 bytes after a kill,
    truncated by a full disk) is skipped with a warning naming it and the checkpoint used
    instead. None if there is no checkpoint.

    Raises:
        ResumeRefused: checkpoints exist but none loads.
    """
    files = [p for p in folder.glob("*.ckpt") if p.is_file()] if folder.is_dir() else []
    files += [p for p in extra or [] if p.is_file()]
    # last*.ckpt (what Lightning's "last" means) and hpc_ckpt first, then the others,
    # each newest first
    files.sort(key=lambda p: (not p.name.startswith(("last", "hpc_ckpt_")), -p.stat().st_mtime))
    if not files:
        return None
    skipped = []
    for path in files:
        try:
            ckpt = load_checkpoint_file(path)
        except (FileNotFoundError, ValueError) as err:
            skipped.append(f"  {path}: {str(err).split('. Pass', 1)[0]}")
            continue
        if skipped:
            warnings.warn(
                "--ckpt_path last: skipping unreadable checkpoint(s):\n" + "\n".join(skipped)
                + f"\nresuming from the newest readable one, {path} (epoch "
                f"{ckpt.get('epoch')}, step {ckpt.get('global_step')})",
                UserWarning,
                stacklevel=2,
            )  # fmt: skip
        return path, ckpt
    raise ResumeRefused(
        f"--ckpt_path last: no checkpoint in {folder} can be read:\n" + "\n".join(skipped)
        + "\nstart from scratch without --ckpt_path, or pass a good checkpoint file"
    )  # fmt: skip
