"""The run a parsed ``rl-gap fit|validate|test|predict`` command line describes.

Used by :class:`rl_gap.training.cli.RLGapCLI` between parsing and building anything:

- :func:`resolve_run`: the seed (drawn now for ``seed_everything: true``), the training
  config and its hash of command-line overrides (:mod:`rl_gap.training.run_config`), the
  run folder (a new version folder for a fresh fit, :mod:`rl_gap.training.run_folder`),
  and the checks of ``--ckpt_path`` (:mod:`rl_gap.training.resume`);
- :func:`setting_error`: a bad loss or optimizer value met while the module is built
  (``temperature: 0``, ``lr: -1``) as one line naming the key, not the Union traceback
  jsonargparse wraps it in;
- :func:`usage_error`: one message on stderr, exit status 2 (as argparse).
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from rl_gap.losses.registry import LossSectionError
from rl_gap.optim import OptimizerSettingsError
from rl_gap.training.resume import Resume, ResumeRefused, check_resume
from rl_gap.training.run_checkpoint import (
    newest_in_version,
    no_checkpoint_error,
    owning_run,
    requeued_version,
    resolve_last,
)
from rl_gap.training.run_config import (
    differing_keys,
    flatten_config,
    overrides_hash,
    run_dir_for,
    training_config,
)
from rl_gap.training.run_folder import auto_seed, choose_run_dir, newest

_EVAL = ("validate", "test", "predict")

# the recipe key a setting error is reported under
_SETTING_KEYS: tuple[tuple[type[ValueError], str], ...] = (
    (LossSectionError, "--model.loss"),
    (OptimizerSettingsError, "--model.init_args"),
)


def usage_error(message: str) -> NoReturn:
    """A usage error: one message on stderr, exit status 2 (as argparse)."""
    sys.stderr.write(f"rl-gap: error: {message}\n")
    raise SystemExit(2)


def setting_error(error: BaseException) -> str | None:
    """One line for a setting refused while the classes are built, else None.

    ``--model.loss: <message>`` / ``--model.init_args: <message>`` for a loss or optimizer
    setting error (by type) anywhere in ``error``'s chain; ``--model.init_args: <message>``
    or ``--data.init_args: <message>`` for a module's or data module's own ``ValueError``
    from its constructor, which jsonargparse hands on as the cause of its multi-line
    "does not validate against any of the Union subtypes" report. The refusal is found by
    where it was raised (a constructor frame of a LightningModule / LightningDataModule),
    never by reading jsonargparse's text.
    """
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        for kind, key in _SETTING_KEYS:
            if isinstance(cause, kind):
                return f"{key}: {cause}"
        group = _refusing_group(cause) if isinstance(cause, ValueError) else None
        if group is not None:
            return f"{group}: {cause}"
        cause = cause.__cause__ or cause.__context__
    return None


def _refusing_group(error: BaseException) -> str | None:
    """``--model.init_args`` / ``--data.init_args`` when ``error`` was raised inside the
    ``__init__`` of a LightningModule / LightningDataModule (the innermost one), else None."""
    import lightning as L

    group = None
    frame = error.__traceback__
    while frame is not None:
        code, owner = frame.tb_frame.f_code, frame.tb_frame.f_locals.get("self")
        if code.co_name == "__init__" and isinstance(owner, L.LightningDataModule):
            group = "--data.init_args"
        elif code.co_name == "__init__" and isinstance(owner, L.LightningModule):
            group = "--model.init_args"
        frame = frame.tb_next
    return group


@dataclass
class RunSetup:
    """Where a command's outputs go and what it trains.

    Attributes:
        root: the run folder.
        config: the training config (``run_config.training_config``), compared on resume.
        full: every resolved key but ``config`` (the W&B config).
        overrides: the 8-hex hash of the training keys the command line changed ("" if none).
        versioned_from: the folder a fresh fit found holding a saved run (its new version
            is ``root``), else None.
        resume: the checkpoint a ``--ckpt_path`` resumes, checked; None if none.
    """

    root: Path
    config: dict[str, Any]
    full: dict[str, Any]
    overrides: str
    versioned_from: Path | None
    resume: Resume | None = None
    changed: dict[str, Any] = field(default_factory=dict)  # training keys the command line set


def resolve_run(parser: Any, config: Any) -> RunSetup:
    """Seed, training config, run folder; check ``--ckpt_path`` (before Lightning reads it).

    ``config`` is the parsed namespace; its ``seed_everything`` (when drawn) and its
    ``ckpt_path`` (``last`` replaced by the checkpoint found) are set in place.
    """
    sub = config.get("subcommand")
    cfg = config[sub] if sub else config
    every = cfg.get("checkpoint_every_n_steps")
    if every is not None and every < 0:
        usage_error(f"--checkpoint_every_n_steps must be >= 0, got {every}")
    seed = cfg.get("seed_everything")
    current = training_config(flatten_config(cfg))
    baseline = baseline_config(parser, sub, cfg.get("config"))
    overrides = overrides_hash(current, baseline)
    changed = {}
    if baseline is not None:
        keys = differing_keys(current, baseline)
        changed = {k: current.get(k) for k in keys if k != "seed_everything"}
    base = Path(
        cfg.get("trainer.default_root_dir")
        or run_dir_for(
            cfg.get("config"), cfg.get("output_dir"), cfg.get("run_name"), seed, overrides
        )
    )
    ckpt_path = cfg.get("ckpt_path")
    ckpt_path = None if ckpt_path is None else str(ckpt_path)
    if sub in _EVAL and not ckpt_path and not cfg.get("initial_weights"):
        usage_error(no_checkpoint_error(sub))
    current = training_config(flatten_config(cfg))
    root, ckpt_path, note = _run_folder(sub, cfg, base, ckpt_path, current)
    if note:
        sys.stderr.write(note + "\n")
    if sub:
        cfg["ckpt_path"] = ckpt_path
    if seed is True:  # drawn now (or read back from the run being resumed), recorded in it
        # run=False: a folder holding checkpoints can only be resumed (FreshFitGuard)
        seed = auto_seed(ckpt_path or (None if sub else "last"), root)
        cfg["seed_everything"] = seed
    run = RunSetup(
        root=root,
        config=training_config(flatten_config(cfg)),
        full={k: v for k, v in flatten_config(cfg).items() if k != "config"},
        overrides=overrides,
        versioned_from=base if root != base and sub == "fit" and not ckpt_path else None,
        changed=changed,
    )
    if ckpt_path:
        force = bool(cfg.get("force_resume"))
        try:
            run.resume = check_resume(sub, ckpt_path, root, run.config, force)
        except ResumeRefused as err:
            usage_error(str(err))
        if run.resume is not None and ckpt_path == "last":
            # Lightning's own "last" would pick the newest last*.ckpt even if damaged
            cfg["ckpt_path"] = str(run.resume.path)
    return run


def _run_folder(
    sub: str | None, cfg: Any, base: Path, ckpt_path: str | None, current: dict[str, Any]
) -> tuple[Path, str | None, str | None]:
    """(run folder, checkpoint to load, a line for stderr) of a command (``run_checkpoint``)."""
    if not sub:  # run=False: whether fit will resume is unknown; FreshFitGuard decides
        return newest(base), ckpt_path, None
    named = bool(cfg.get("trainer.default_root_dir") or cfg.get("run_name"))
    if sub in _EVAL and not ckpt_path and not named:
        # --initial_weights: the untrained (or pretrained) model's outputs never land in,
        # or overwrite, a trained run's folder
        return base.with_name(base.name + "-initial"), None, None
    if ckpt_path == "last":
        try:
            found = resolve_last(sub, base, current, search_siblings=not named)
        except ResumeRefused as err:
            usage_error(str(err))
        if found.path is None:  # a fit with nothing to resume yet: never in silence
            return found.root, None, (
                f"rl-gap: --ckpt_path last: no checkpoint of this run yet; starting it in "
                f"{found.root}"
            )  # fmt: skip
        return found.root, str(found.path), found.note
    if ckpt_path and ckpt_path not in ("best", "hpc") and not ckpt_path.startswith("registry"):
        owner = owning_run(ckpt_path)
        if owner is not None:  # one run's history in one folder
            return owner, ckpt_path, None
    if sub == "fit" and not ckpt_path:
        version = requeued_version(base)
        found = newest_in_version(version) if version is not None else None
        if version is not None and found is not None:
            return version, str(found[0]), (
                f"rl-gap: {version} holds Lightning's hpc_ckpt (a requeued job): resuming "
                f"{found[0]} (epoch {found[1].get('epoch')}, step {found[1].get('global_step')})"
            )  # fmt: skip
    return choose_run_dir(base, sub, ckpt_path), ckpt_path, None


def baseline_config(
    parser: Any, sub: str | None, config_files: list[Any] | None
) -> dict[str, Any] | None:
    """The training config of the recipe alone (the first config file: an overlay's keys
    are overrides), without command-line overrides."""
    argv = [sub] if sub else []
    for path in (config_files or [])[:1]:
        argv += ["--config", str(getattr(path, "absolute", path))]
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            base = parser.parse_args(argv)
    except (SystemExit, Exception):  # e.g. a required key given only on the command line
        return None
    return training_config(flatten_config(base[sub] if sub else base))
