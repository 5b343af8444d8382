"""Which checkpoint a command uses, resolved by the run that wrote it, never by a folder name alone.

A run folder (``<recipe folder>/seed0[-<hash>]``, :mod:`rl_gap.training.run_config`) and its
versions (``-v2``, ...; :mod:`rl_gap.training.run_folder`) hold one training run. Its
*resumable checkpoints* are ``<version>/checkpoints/*.ckpt`` and Lightning's
``<version>/hpc_ckpt_<n>.ckpt`` (written on SLURM's ``--signal`` before a requeue).

- ``--ckpt_path last`` (``fit``, ``validate``, ``test``, ``predict``): the newest version of the
  run that *holds* a checkpoint (a newer empty version, left by a launch stopped while starting,
  hides nothing), and in it the newest readable ``last*.ckpt``/``hpc_ckpt_*.ckpt`` (else any
  ``*.ckpt``);
- when this configuration's folder holds none, the other runs of the same recipe and seed are
  looked at: one whose training config differs from this command's only in keys that do not
  change the objective (:data:`CONTINUABLE_KEYS`: ``max_epochs``, ``max_steps``, the
  validation schedule) *is* this run, continued; a differing one is never taken silently: the
  command is refused naming each candidate, the keys that differ and what to type instead;
  with no run of the recipe and seed at all, ``fit`` starts it (the first launch of a
  set-and-forget job script) and the evaluation commands are refused;
- a ``fit`` without ``--ckpt_path`` whose newest version holds an ``hpc_ckpt_<n>.ckpt`` is a
  requeued job: it resumes that version;
- ``--ckpt_path <file>`` inside ``<run>/checkpoints/`` belongs to ``<run>``: a resumed fit
  continues there, an evaluation writes there (one run's history in one folder).

Pure path and config logic (checkpoints are read through :mod:`rl_gap.training.resume`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_gap.training.checkpoint_scan import ResumeRefused, newest_readable_checkpoint
from rl_gap.training.run_config import differing_keys
from rl_gap.training.run_folder import run_versions

__all__ = [
    "CONTINUABLE_KEYS",
    "Resolved",
    "continuable",
    "owning_run",
    "requeued_version",
    "resolve_last",
    "resumable_files",
]

# Training keys a resumed run may change and still be the same run: how long it trains and
# when it validates, not what it optimises. Changed on resume, they are recorded in the run
# (the checkpoints' config record and ``rl_gap.changes``, ``version_N/config.yaml``).
CONTINUABLE_KEYS: tuple[str, ...] = (
    "trainer.max_epochs",
    "trainer.max_steps",
    "trainer.min_epochs",
    "trainer.min_steps",
    "trainer.check_val_every_n_epoch",
    "trainer.val_check_interval",
    "trainer.limit_val_batches",
)

_HPC = re.compile(r"hpc_ckpt_(\d+)\.ckpt")
_EVAL = ("validate", "test", "predict")


def continuable(keys: list[str]) -> bool:
    """Whether every key of ``keys`` may change on a resume (:data:`CONTINUABLE_KEYS`)."""
    return all(k in CONTINUABLE_KEYS for k in keys)


def _hpc_files(version: Path) -> list[Path]:
    if not version.is_dir():
        return []
    return [p for p in version.glob("hpc_ckpt_*.ckpt") if _HPC.fullmatch(p.name) and p.is_file()]


def resumable_files(version: Path) -> list[Path]:
    """The checkpoints a version holds: ``checkpoints/*.ckpt`` and ``hpc_ckpt_<n>.ckpt``."""
    folder = version / "checkpoints"
    files = sorted(p for p in folder.glob("*.ckpt") if p.is_file()) if folder.is_dir() else []
    return files + sorted(_hpc_files(version))


def newest_in_version(version: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest readable checkpoint of one version (``last``/``hpc`` first), else None.

    Raises:
        ResumeRefused: it holds checkpoints but none can be read.
    """
    return newest_readable_checkpoint(version / "checkpoints", extra=_hpc_files(version))


def owning_run(ckpt_path: str) -> Path | None:
    """The run folder a checkpoint file belongs to (``<run>/checkpoints/x.ckpt``,
    ``<run>/hpc_ckpt_<n>.ckpt`` of a folder ``rl-gap fit`` wrote), else None."""
    file = Path(ckpt_path)
    if file.parent.name == "checkpoints":
        owner = file.parent.parent
    elif _HPC.fullmatch(file.name):
        owner = file.parent
    else:
        return None
    return owner if looks_like_run(owner) else None


def requeued_version(base: Path) -> Path | None:
    """The newest version of ``base`` holding a checkpoint, if it also holds an hpc_ckpt."""
    for version in reversed(run_versions(base)):
        if resumable_files(version):
            return version if _hpc_files(version) else None
    return None


@dataclass
class Candidate:
    """Another run of the same recipe and seed: its folder, newest checkpoint and differing keys."""

    root: Path
    path: Path
    keys: list[str]
    config: dict[str, Any] | None


@dataclass
class Resolved:
    """What ``--ckpt_path last`` resolved to.

    Attributes:
        root: the run folder the command writes to.
        path: the checkpoint to load; None: nothing to resume (a fit starts the run).
        note: a line for stderr (a continued run's changed keys), or None.
        changed: key -> (checkpoint's value, this command's value) of continuable keys.
    """

    root: Path
    path: Path | None
    note: str | None = None
    changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)


def _sibling_bases(base: Path) -> list[Path]:
    """The run folders of the same recipe and seed as ``base`` (other override hashes)."""
    seed = re.sub(r"-[0-9a-f]{8}$", "", base.name)
    pattern = re.compile(rf"{re.escape(seed)}(-[0-9a-f]{{8}})?")
    if not base.parent.is_dir():
        return []
    return sorted(p for p in base.parent.iterdir() if pattern.fullmatch(p.name) and p != base)


def _newest_of_run(base: Path) -> tuple[Path, Path, dict[str, Any]] | None:
    for version in reversed(run_versions(base)):
        found = newest_in_version(version)
        if found is not None:
            return version, found[0], found[1]
    return None


def _candidates(base: Path, current: dict[str, Any]) -> list[Candidate]:
    found = []
    for other in _sibling_bases(base):
        try:
            newest = _newest_of_run(other)
        except ResumeRefused:  # another run's damaged files are not this command's problem
            continue
        if newest is None:
            continue
        version, path, ckpt = newest
        saved = (ckpt.get("rl_gap") or {}).get("config")
        keys = (
            differing_keys(_comparable(saved), _comparable(current)) if saved else ["<unrecorded>"]
        )
        found.append(Candidate(version, path, keys, saved))
    return sorted(found, key=lambda c: (len(c.keys), str(c.root)))


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    # the seed is part of the folder name (same seed) or drawn (seedauto): not a difference
    return {k: v for k, v in config.items() if k != "seed_everything"}


def _changes(saved: dict[str, Any] | None, current: dict[str, Any], keys: list[str]):
    saved = saved or {}
    return {k: (saved.get(k), current.get(k)) for k in keys}


def _describe(c: Candidate, current: dict[str, Any], limit: int = 4) -> str:
    if c.config is None:
        return f"  {c.path} (no config record)"
    shown = ", ".join(
        f"{k}: {c.config.get(k, '<unset>')!r} -> {current.get(k, '<unset>')!r}"
        for k in c.keys[:limit]
    )
    more = f" and {len(c.keys) - limit} more" if len(c.keys) > limit else ""
    return f"  {c.path} (differs in {shown}{more})"


def resolve_last(
    subcommand: str, base: Path, current: dict[str, Any], search_siblings: bool
) -> Resolved:
    """Resolve ``--ckpt_path last`` for a command whose run folder is ``base`` (module docstring).

    Args:
        subcommand: ``fit``, ``validate``, ``test`` or ``predict``.
        base: this configuration's run folder (first version).
        current: this command's training config (``run_config.training_config``).
        search_siblings: look at the other runs of the recipe and seed (False under
            ``--run_name`` or ``trainer.default_root_dir``: the user named the folder).

    Raises:
        ResumeRefused: no checkpoint can be used without guessing (the message names the
            candidates and the command to type), or none can be read.
    """
    own = _newest_of_run(base)
    if own is not None:
        return Resolved(own[0], own[1])
    candidates = _candidates(base, current) if search_siblings else []
    same = [c for c in candidates if continuable(c.keys)]
    if len(same) > 1 and not any(not c.keys for c in same):
        listed = "\n".join(_describe(c, current) for c in same[:5])
        raise ResumeRefused(
            f"--ckpt_path last: no checkpoint of this configuration in {base}, and "
            f"{len(same)} runs of this recipe and seed could be meant (they differ from this "
            f"command only in how long they train or when they validate):\n{listed}\n"
            "pass the one you mean as --ckpt_path <file>"
        )
    if same:
        chosen = same[0]
        changed = _changes(chosen.config, current, chosen.keys)
        note = None
        if changed:
            rows = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items())
            note = (
                f"rl-gap: --ckpt_path last: continuing the run in {chosen.root} from "
                f"{chosen.path.name} with {rows} (recorded in the run; these keys do not "
                "change what is optimised)"
            )
        return Resolved(chosen.root, chosen.path, note, changed)
    if not candidates:
        if subcommand in _EVAL:
            raise ResumeRefused(
                f"--ckpt_path last: no checkpoint of this run in {base} (and no other run of "
                "this recipe and seed): train it first (rl-gap fit with the same recipe and "
                "overrides), pass a checkpoint file, or --initial_weights true to evaluate the "
                "model as built"
            )
        return Resolved(_first_version(base), None)
    listed = "\n".join(_describe(c, current) for c in candidates[:5])
    more = f"\n  ... and {len(candidates) - 5} more" if len(candidates) > 5 else ""
    if subcommand in _EVAL:
        advice = (
            "pass the checkpoint to evaluate as --ckpt_path <file>, or give the same "
            "overrides as the fit that wrote it"
        )
    else:
        advice = (
            "to start this configuration as a new run, run the same command without "
            "--ckpt_path; to continue one of those runs, pass its file as --ckpt_path "
            "(with --force_resume true if its keys differ)"
        )
    raise ResumeRefused(
        f"--ckpt_path last: no checkpoint of this configuration in {base}; the runs of this "
        f"recipe and seed that hold one were trained with other keys:\n{listed}{more}\n{advice}"
    )


def _first_version(base: Path) -> Path:
    versions = run_versions(base)
    return versions[-1] if versions else base


# --------------------------------------------------------- comparing on resume
# Settings a resumed fit cannot change: the optimizer and scheduler states restored from the
# checkpoint carry their own values (torch's load_state_dict restores each parameter
# group's lr, weight decay, betas, momentum; the scheduler its base learning rates).
OPTIMIZER_STATE_KEYS: tuple[str, ...] = (
    "model.init_args.optimizer",
    "model.init_args.lr",
    "model.init_args.weight_decay",
    "model.init_args.betas",
    "model.init_args.momentum",
    "model.init_args.lr_scales",
)


def split_differences(
    saved: dict[str, Any], current: dict[str, Any]
) -> tuple[list[str], dict[str, tuple[Any, Any]]]:
    """(keys that make it another run, continuable key -> (checkpoint's, now)) of a resume."""
    keys = differing_keys(_comparable(saved), _comparable(current))
    other = [k for k in keys if k not in CONTINUABLE_KEYS]
    changed = {k: (saved.get(k), current.get(k)) for k in keys if k in CONTINUABLE_KEYS}
    return other, changed


def unappliable_error(path: Any, saved: dict[str, Any], current: dict[str, Any], keys: list[str]):
    """The refusal of ``--force_resume`` changing a setting the restored state overrides, or None."""
    bad = [k for k in keys if any(k == o or k.startswith(o + ".") for o in OPTIMIZER_STATE_KEYS)]
    if not bad:
        return None
    rows = ", ".join(f"{k} {saved.get(k)!r} -> {current.get(k)!r}" for k in bad)
    return (
        f"--force_resume cannot change {rows}: resuming {path} restores its optimizer and "
        "scheduler states, which keep the checkpoint's values (the run would train with them "
        "while recording the new ones). Keep these keys as they were to resume, or start a "
        "new run (the same command without --ckpt_path)"
    )


def evaluation_model_error(path: Any, saved: dict[str, Any] | None, current: dict[str, Any]):
    """The refusal of ``model.*`` overrides an evaluation of checkpoint ``path`` cannot apply."""
    if not saved:
        return None
    keys = [
        k for k in differing_keys(_comparable(saved), _comparable(current))
        if k.startswith("model.")
    ]  # fmt: skip
    if not keys:
        return None
    rows = ", ".join(f"{k} {current.get(k, '<unset>')!r}" for k in keys[:5])
    return (
        f"{path} was trained with other model settings than this command gives ({rows}; the "
        f"checkpoint's: {', '.join(repr(saved.get(k, '<unset>')) for k in keys[:5])}): an "
        "evaluation uses the checkpoint's model as trained; drop these overrides (or pass the "
        "checkpoint of the run trained with them)"
    )


def no_checkpoint_error(subcommand: str) -> str:
    """The refusal of ``validate``/``test``/``predict`` given no checkpoint."""
    return (
        f"rl-gap {subcommand} needs a trained model: pass --ckpt_path last (this "
        "configuration's run) or --ckpt_path <file>; to evaluate the model as built (random "
        "or pretrained initial weights) pass --initial_weights true"
    )


def looks_like_run(folder: Path) -> bool:
    """Whether ``folder`` was written by ``rl-gap fit`` (lock file, W&B id or CSV logs)."""
    return (
        (folder / ".rl_gap.lock").exists()
        or (folder / "wandb_id").exists()
        or any(folder.glob("version_*"))
    )
