"""Which folder a command writes to, so that a fresh fit never replaces a saved run.

A run folder (``<output_dir>/<recipe>/seed0[-<hash>]``, see :mod:`rl_gap.training.run_config`)
holds one training run. Its *versions* are the folder itself and siblings ``<folder>-v2``,
``<folder>-v3``, ...; a version is *used* once it holds a checkpoint.

- a fresh ``fit`` (no ``--ckpt_path``) writes to the newest version if it is unused, else
  to a new version: rerunning a finished run's command never touches its checkpoints;
- ``--ckpt_path last`` and ``--ckpt_path <file>``: :mod:`rl_gap.training.run_checkpoint`
  (the newest version holding a checkpoint; a file's own run folder).

:class:`FreshFitGuard` enforces the rule for every ``Trainer.fit`` (also from Python, where
the CLI cannot know at parse time whether ``fit`` will be given a checkpoint): a fit that
restores nothing into a folder holding checkpoints stops before its first step.
"""

from __future__ import annotations

import os
import random
import re
import warnings
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback

__all__ = [
    "FreshFitGuard",
    "auto_seed",
    "choose_run_dir",
    "holds_checkpoints",
    "newest",
    "recorded_seed",
    "run_versions",
]


def run_versions(base: Path) -> list[Path]:
    """The existing versions of run folder ``base`` (itself, ``base-v2``, ...), oldest first."""
    found = [(1, base)] if base.is_dir() else []
    pattern = re.compile(rf"{re.escape(base.name)}-v(\d+)")
    if base.parent.is_dir():
        for path in base.parent.iterdir():
            match = pattern.fullmatch(path.name)
            if match and path.is_dir():
                found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def newest(base: Path) -> Path:
    """The newest existing version of ``base`` (``base`` itself when none exists)."""
    versions = run_versions(base)
    return versions[-1] if versions else base


def recorded_seed(ckpt_path: str, root: Path) -> int | None:
    """The ``seed_everything`` recorded in the checkpoint ``--ckpt_path`` names, if any.

    Unreadable or foreign checkpoints give None (``check_resume`` reports them).
    """
    from rl_gap.training.checkpoint_scan import ResumeRefused, newest_readable_checkpoint
    from rl_gap.training.run_config import load_checkpoint_file

    try:
        if ckpt_path == "last":
            found = newest_readable_checkpoint(root / "checkpoints")
            ckpt = found[1] if found else {}
        elif ckpt_path in ("best", "hpc") or ckpt_path.startswith("registry"):
            return None
        else:
            ckpt = load_checkpoint_file(ckpt_path)
    except (ResumeRefused, FileNotFoundError, ValueError):
        return None
    seed = ((ckpt.get("rl_gap") or {}).get("config") or {}).get("seed_everything")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def auto_seed(ckpt_path: str | None, root: Path) -> int:
    """``seed_everything: true``: the seed recorded by the checkpoint resumed, else a new one.

    A process started by a launcher for another rank takes the seed its launcher drew
    (``PL_GLOBAL_SEED``); in the launching process that variable may be left over from
    an earlier run in the same process, so a fresh run draws its own.
    """
    from rl_gap.training.run_lock import starts_the_run

    recorded = recorded_seed(ckpt_path, root) if ckpt_path else None
    if recorded is not None:
        return recorded
    if not starts_the_run() and os.environ.get("PL_GLOBAL_SEED"):
        return int(os.environ["PL_GLOBAL_SEED"])
    return random.randint(0, 2**32 - 1)


def checkpoint_files(folder: Path) -> list[Path]:
    """The ``*.ckpt`` files (or Lightning's checkpoint folders) in ``folder/checkpoints``."""
    ckpts = folder / "checkpoints"
    return sorted(ckpts.glob("*.ckpt")) if ckpts.is_dir() else []


def holds_checkpoints(folder: Path) -> bool:
    return bool(checkpoint_files(folder))


def _next_version(base: Path, versions: list[Path]) -> Path:
    numbers = [1] + [int(p.name.rsplit("-v", 1)[1]) for p in versions if p != base]
    return base.parent / f"{base.name}-v{max(numbers) + 1}"


def choose_run_dir(base: Path, subcommand: str | None, ckpt_path: str | None) -> Path:
    """The version of ``base`` a command writes to (module docstring)."""
    versions = run_versions(base)
    latest = versions[-1] if versions else base
    if (
        ckpt_path
        and ckpt_path not in ("last", "best", "hpc")
        and not ckpt_path.startswith("registry")
    ):
        file = Path(ckpt_path).resolve()
        for version in versions:
            if file.parent == (version / "checkpoints").resolve():
                return version
    elif ckpt_path or subcommand not in (None, "fit"):
        return latest
    # a fresh fit, or a fit from a checkpoint of another folder
    return _next_version(base, versions) if holds_checkpoints(latest) else latest


def versioned_message(base: Path, chosen: Path) -> str | None:
    """A note for a fresh fit sent to a new version: where the earlier run is and how to resume it."""
    versions = run_versions(base)
    earlier = [v for v in versions if v != chosen and holds_checkpoints(v)]
    if not earlier:
        return None
    last = earlier[-1]
    ckpts = checkpoint_files(last)
    resume = next((c for c in ckpts if c.name == "last.ckpt"), ckpts[-1])
    return (
        f"rl-gap: {last} holds an earlier run; this fresh fit writes to {chosen} (nothing of "
        f"the earlier run is touched). To continue the earlier run instead: --ckpt_path {resume}"
    )


class FreshFitGuard(Callback):
    """Stops a fit that restores no checkpoint before it can overwrite a folder's checkpoints.

    Args:
        dirpath: the run's checkpoint folder.
        wandb_id: the W&B id this fit logs to (a resumed checkpoint with another id gets a
            warning: its dashboard is not continued).
    """

    def __init__(self, dirpath: str | Path, wandb_id: str | None = None) -> None:
        self.dirpath = Path(dirpath)
        self.wandb_id = wandb_id

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        resumed = trainer.ckpt_path
        if resumed is None:
            saved = sorted(self.dirpath.glob("*.ckpt")) if self.dirpath.is_dir() else []
            if saved:
                names = ", ".join(p.name for p in saved[:4]) + (" ..." if len(saved) > 4 else "")
                raise FileExistsError(
                    f"{self.dirpath} holds checkpoints of an earlier run ({names}); a fresh fit "
                    "would replace them. Resume it (rl-gap fit ... --ckpt_path last, or "
                    "trainer.fit(..., ckpt_path='last')) or write this run elsewhere "
                    "(another --run_name; the rl-gap fit command itself sends a fresh fit to a "
                    "new version folder)"
                )
        elif self.wandb_id:
            self._warn_other_wandb_run(trainer, str(resumed))

    def _warn_other_wandb_run(self, trainer: L.Trainer, resumed: str) -> None:
        record = getattr(trainer, "_rl_gap_resumed_wandb_id", None)
        if record and record != self.wandb_id:
            warnings.warn(
                f"fit resumes {resumed} (W&B run {record}) but logs to W&B run {self.wandb_id}: "
                "pass --ckpt_path to rl-gap fit to continue the checkpoint's W&B run",
                UserWarning,
                stacklevel=2,
            )

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint):
        trainer._rl_gap_resumed_wandb_id = (checkpoint.get("rl_gap") or {}).get("wandb_id")
