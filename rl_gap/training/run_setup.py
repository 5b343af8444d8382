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
from rl_gap.training.run_config import (
    differing_keys,
    flatten_config,
    overrides_hash,
    run_dir_for,
    training_config,
)
from rl_gap.training.run_folder import auto_seed, choose_run_dir, newest

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
    """``--model.loss: <message>`` for a loss or optimizer setting error in ``error``'s chain,
    or ``--model.init_args: <message>`` for a class's own refusal that jsonargparse wrapped
    into its "does not validate against any of the Union subtypes" report."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        for kind, key in _SETTING_KEYS:
            if isinstance(cause, kind):
                return f"{key}: {cause}"
        cause = cause.__cause__ or cause.__context__
    return _constructor_error(str(error))


def _constructor_error(report: str) -> str | None:
    """The first subtype's error of a jsonargparse Union report (the None subtype's is noise)."""
    if "Does not validate against any of the Union subtypes" not in report:
        return None
    errors = [
        line.strip()[2:]
        for line in report.splitlines()
        if line.strip().startswith("- ") and "Expected a <class 'NoneType'>" not in line
    ]
    if not errors:
        return None
    group = (
        "--data.init_args" if "DataModule" in report.split("Errors:")[0] else "--model.init_args"
    )
    return f"{group}: {errors[0]}"


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
    # run=False (no subcommand): whether fit will resume is unknown; FreshFitGuard decides
    root = choose_run_dir(base, sub, ckpt_path) if sub else newest(base)
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


def baseline_config(
    parser: Any, sub: str | None, config_files: list[Any] | None
) -> dict[str, Any] | None:
    """The training config of the recipe(s) alone, without command-line overrides."""
    argv = [sub] if sub else []
    for path in config_files or []:
        argv += ["--config", str(getattr(path, "absolute", path))]
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            base = parser.parse_args(argv)
    except (SystemExit, Exception):  # e.g. a required key given only on the command line
        return None
    return training_config(flatten_config(base[sub] if sub else base))
