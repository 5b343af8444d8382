"""What ``--ckpt_path`` resumes, checked before Lightning reads the file.

Used by :mod:`rl_gap.training.cli` while it parses the command line, so that a bad
checkpoint stops the command before anything is built or written:

- ``--ckpt_path last``: the newest ``last*.ckpt`` that loads, else the newest readable
  ``*.ckpt`` (a damaged file is skipped with a warning naming both); no checkpoint at all
  lets Lightning start from scratch;
- a file that is not a checkpoint, or holds non-finite weights, is refused;
- ``fit`` from a checkpoint of a different configuration is refused with the differing
  keys named, unless ``force`` (then they are a warning).

A refusal is a :class:`ResumeRefused`; the CLI prints its message and exits with status 2.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_gap.training.checkpoint_scan import ResumeRefused, newest_readable_checkpoint
from rl_gap.training.run_config import (
    config_mismatch,
    load_checkpoint_file,
    nonfinite_weights_error,
    resume_mismatch_message,
)

__all__ = [
    "Resume",
    "ResumeRefused",
    "check_resume",
    "newest_readable_checkpoint",
    "nonfinite_optimizer_error",
]


@dataclass(frozen=True)
class Resume:
    """The checkpoint a run resumes: its file and the W&B run id it recorded (None: none)."""

    path: Path
    wandb_id: str | None


def _nonfinite_entries(value: Any, where: str) -> list[str]:
    import torch

    if isinstance(value, torch.Tensor):
        bad = value.is_floating_point() and not bool(torch.isfinite(value).all())
        return [where] if bad else []
    if isinstance(value, float):
        return [] if math.isfinite(value) else [where]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _nonfinite_entries(v, f"{where}.{k}")]
    if isinstance(value, (list, tuple)):
        return [x for i, v in enumerate(value) for x in _nonfinite_entries(v, f"{where}[{i}]")]
    return []


def nonfinite_optimizer_error(ckpt: dict[str, Any], path: str | Path) -> str | None:
    """None if the optimizer state of ``ckpt`` is finite, else a message naming the entries.

    A NaN/inf moment estimate (Adam's ``exp_avg_sq``) turns every later step into NaN,
    however finite the weights are: resuming it would diverge at the first step.
    """
    bad = []
    for i, opt in enumerate(ckpt.get("optimizer_states") or []):
        bad += _nonfinite_entries((opt or {}).get("state") or {}, f"optimizer {i} state")
    if not bad:
        return None
    shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    return (
        f"{path} holds a NaN/inf optimizer state in {len(bad)} entr"
        f"{'y' if len(bad) == 1 else 'ies'} ({shown}): resuming it would make every step "
        "NaN; resume an earlier checkpoint (e.g. an epoch=... file)"
    )


def check_resume(
    subcommand: str | None, ckpt_path: str, root: Path, train: dict[str, Any], force: bool
) -> Resume | None:
    """Check ``--ckpt_path`` for a run in ``root`` whose training config is ``train``.

    Args:
        subcommand: ``fit``, ``validate``, ... (only ``fit`` compares configurations).
        ckpt_path: as given: a file, ``last`` (looked up in ``root/checkpoints``), or one of
            Lightning's own ``best``/``hpc``/``registry...`` (left to Lightning).
        force: ``--force_resume``: a differing configuration is a warning, not a refusal.

    Returns:
        The checkpoint to resume; None when there is nothing to check (Lightning's own
        names, or ``last`` with no checkpoint yet).

    Raises:
        ResumeRefused: no readable checkpoint, non-finite weights, or (``fit``) another
            configuration's checkpoint without ``force``.
    """
    if ckpt_path == "last":
        found = newest_readable_checkpoint(root / "checkpoints")
        if found is None:
            return None  # Lightning warns and starts from scratch (set-and-forget in job scripts)
        path, ckpt = found
    elif ckpt_path in ("best", "hpc") or ckpt_path.startswith("registry"):
        return None
    else:
        path = Path(ckpt_path)
        try:
            ckpt = load_checkpoint_file(path)
        except (FileNotFoundError, ValueError) as err:
            raise ResumeRefused(str(err)) from None
    nonfinite = nonfinite_weights_error(ckpt, path)
    if subcommand == "fit":
        nonfinite = nonfinite or nonfinite_optimizer_error(ckpt, path)
    if nonfinite:
        raise ResumeRefused(nonfinite)
    from rl_gap.training.run_checkpoint import (
        evaluation_model_error,
        split_differences,
        unappliable_error,
    )

    record = ckpt.get("rl_gap") or {}
    resume = Resume(path, record.get("wandb_id"))
    if subcommand != "fit":
        problem = evaluation_model_error(path, record.get("config"), train)
        if problem:
            raise ResumeRefused(problem)
        return resume
    if record.get("config") is None:
        warnings.warn(
            f"{path} holds no rl_gap config record; cannot check that it comes from the "
            "same configuration",
            UserWarning,
            stacklevel=2,
        )
        return resume
    # max_epochs, the validation schedule: the same run, continued (recorded by FaultTolerance)
    other, _ = split_differences(record["config"], train)
    saved_other = {k: record["config"][k] for k in other if k in record["config"]}
    now_other = {k: train[k] for k in other if k in train}
    diff = config_mismatch(saved_other, now_other)
    if diff and not force:
        raise ResumeRefused(resume_mismatch_message(path, diff))
    if diff:
        problem = unappliable_error(path, record["config"], train, other)
        if problem:
            raise ResumeRefused(problem)
        warnings.warn(
            f"--force_resume: resuming {path} written by a different configuration:\n{diff}",
            UserWarning,
            stacklevel=2,
        )
    return resume
