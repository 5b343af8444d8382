"""Where a training run's logs go: CSV + W&B loggers, the W&B run id, the end-of-run summary.

Used by :mod:`rl_gap.training.cli`: with ``--wandb auto`` W&B is *online* when W&B itself
would find credentials (``WANDB_API_KEY``, the ``~/.netrc`` entry ``wandb login`` writes, or
W&B's settings file) and *offline* otherwise (it never waits for a network); one line says
which and why (:func:`wandb_mode_reason`). W&B writes inside the run folder and receives
the whole resolved config. Every fresh fit gets a new W&B run id and its own group (its id,
or ``--wandb_group``); only a resumed fit continues one (the id its checkpoint recorded);
``validate``/``test``/``predict`` and the plain commands (``evaluate``, ``knn``, ...) log
to runs of their own in the training run's group (:func:`wandb_run_for`,
:func:`command_wandb_run`). Run names read ``<recipe> seed<N> <changed keys>``
(:func:`readable_run_name`).
"""

from __future__ import annotations

import re
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.utilities import rank_zero_only

from rl_gap.training.wandb_mode import (  # noqa: F401  (re-exported)
    WandbMode,
    command_wandb_run,
    log_command_result,
    recorded_group,
    resolve_wandb_mode,
    wandb_credentials,
    wandb_mode_reason,
)


def quiet_third_party_tips() -> None:
    """Drop Lightning's litlogger advertisement from the log (printed by every Trainer)."""
    import lightning_utilities.core.rank_zero as rank_zero

    log = rank_zero.log
    if not any(isinstance(f, _TipFilter) for f in log.filters):
        log.addFilter(_TipFilter())


class _TipFilter:
    def filter(self, record: Any) -> bool:
        return "litlogger" not in str(record.msg)


@dataclass(frozen=True)
class WandbRun:
    """Which W&B run a command logs to (:func:`wandb_run_for`)."""

    id: str
    resume: bool  # continue a run of this id (a resumed fit), else a run that must be new
    job_type: str
    group: str | None
    config: dict[str, Any]  # what the command adds to the resolved config


_JOB_TYPES = {
    None: "train",
    "fit": "train",
    "validate": "eval",
    "test": "eval",
    "predict": "predict",
}


def new_run_id() -> str:
    return secrets.token_hex(4)


def wandb_run_for(
    subcommand: str | None,
    root: Path,
    ckpt_path: str | None = None,
    ckpt_wandb_id: str | None = None,
    group: str | None = None,
) -> WandbRun:
    """The W&B run of a command: only a resumed fit continues an id.

    - ``fit`` without a checkpoint: a new id, always, in a group of its own (its id, or
      ``group``), recorded in ``<root>/wandb_group`` for the runs that evaluate it;
    - ``fit --ckpt_path``: the id the checkpoint recorded (a checkpoint without one, in this
      folder: the id in ``<root>/wandb_id``), continued;
    - ``validate``/``test``/``predict``: a run of its own (job type ``eval``/``predict``),
      grouped with the training run that wrote the checkpoint, whose id and path are in
      its config.
    """
    job_type = _JOB_TYPES.get(subcommand, str(subcommand))
    if job_type == "train":
        run_id = ckpt_wandb_id or (_folder_run_id(root, ckpt_path) if ckpt_path else None)
        if run_id:  # a resumed fit stays in the group it started in
            return WandbRun(run_id, True, job_type, group or recorded_group(root) or run_id, {})
        run_id = new_run_id()
        return WandbRun(run_id, False, job_type, group or run_id, {})
    trained = ckpt_wandb_id or (_folder_run_id(root, ckpt_path) if ckpt_path else None)
    config = {"eval.subcommand": subcommand, "eval.ckpt_path": ckpt_path}
    config["eval.training_run_id"] = trained
    group = group or recorded_group(root) or trained or root.name
    return WandbRun(new_run_id(), False, job_type, group, config)


def _folder_run_id(root: Path, ckpt_path: str) -> str | None:
    """The id in ``<root>/wandb_id`` when ``ckpt_path`` lies in ``<root>/checkpoints``."""
    path = root / "wandb_id"
    inside = Path(ckpt_path).resolve().parent == (root / "checkpoints").resolve()
    if inside and path.is_file():
        return path.read_text().strip() or None
    return None


def record_run_id(root: Path, run_id: str, group: str | None = None) -> None:
    """``<root>/wandb_id`` (and ``<root>/wandb_group``): the W&B id and group of the training
    run in this folder (rank 0 writes them)."""
    if rank_zero_only.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        (root / "wandb_id").write_text(run_id + "\n")
        if group:
            (root / "wandb_group").write_text(group + "\n")


def readable_run_name(
    config_files: list[Any] | None,
    seed: Any,
    changed: Mapping[str, Any] | None,
    subcommand: str | None = None,
    limit: int = 120,
    folder: Path | None = None,
) -> str:
    """``sop_gsap seed0 lr=0.001 loss.name=msap``: the recipe's name, the seed and the keys
    the command line changed (``model.init_args.``, ``data.init_args.``, ``trainer.`` dropped), then
    ``:<command>`` for an evaluation; cut at ``limit`` characters with ``+N more``."""
    stem = Path(str(config_files[-1])).stem if config_files else "run"
    words = [stem]
    if isinstance(seed, int) and not isinstance(seed, bool):
        words.append(f"seed{seed}")
    pairs = [f"{_short_key(k)}={_short_value(v)}" for k, v in sorted((changed or {}).items())]
    for i, pair in enumerate(pairs):
        if len(" ".join([*words, pair])) > limit:
            words.append(f"+{len(pairs) - i} more")
            break
        words.append(pair)
    version = re.search(r"-v(\d+)$", folder.name) if folder is not None else None
    if version:  # a fresh fit beside a saved run of the same configuration
        words.append(f"v{version.group(1)}")
    name = " ".join(words)
    return name if subcommand in (None, "fit") else f"{name}:{subcommand}"


def _short_key(key: str) -> str:
    for prefix in ("model.init_args.", "data.init_args.", "model.", "data.", "trainer."):
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key


def _short_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    text = str(value)
    return text if len(text) <= 24 else text[:21] + "..."


def default_loggers(
    root: Path,
    name: str,
    wandb_mode: str,
    project: str,
    wandb_run: WandbRun | None = None,
    entity: str | None = None,
    tags: list[str] | None = None,
    config: dict[str, Any] | None = None,
) -> list[Logger]:
    """CSV logger under ``root/version_N`` plus, unless off, a W&B logger in ``root/wandb``.

    The W&B run is ``wandb_run`` (:func:`wandb_run_for`: its id, continued only for a
    resumed fit, job type and group) with ``config`` (the whole resolved config) and
    the optional ``entity`` and ``tags``.
    """
    loggers: list[Logger] = [CSVLogger(save_dir=str(root), name="")]
    mode, why = wandb_mode_reason(wandb_mode)
    if rank_zero_only.rank == 0:
        print(f"W&B: {mode} ({why})", file=sys.stderr)
    if mode != "off":
        WandbLogger = _wandb_logger_class()  # noqa: N806 (a class)
        root.mkdir(parents=True, exist_ok=True)
        extra: dict[str, Any] = {}
        if wandb_run is not None:
            extra.update(id=wandb_run.id, resume="allow" if wandb_run.resume else "never")
            extra["job_type"] = wandb_run.job_type
            config = {**(config or {}), **wandb_run.config}
            if wandb_run.group:
                extra["group"] = wandb_run.group
        for key, value in (("entity", entity), ("tags", tags)):
            if value:
                extra[key] = list(value) if key == "tags" else value
        loggers.append(
            WandbLogger(
                project=project,
                name=name,
                save_dir=str(root),
                offline=mode == "offline",
                mode=mode,  # explicit: W&B's settings may have been read before WANDB_MODE was set
                log_model=False,
                settings=_wandb_settings(),
                config=config,
                **extra,
            )
        )
    return loggers


def _wandb_settings():
    import wandb

    # W&B's system metrics (GPU/CPU/memory panels) and console capture stay on, offline
    # too: measured on this machine, an offline run starts in ~0.7 s and finishes in
    # ~0.1 s with them, as without (benchmarks/bench_wandb_settings.py). rl-gap prints its
    # own summary of where the run went, so wandb's banner is silenced.
    return wandb.Settings(silent=True)


def is_wandb_logger(logger: Any) -> bool:
    """A Lightning ``WandbLogger`` (or subclass), without importing wandb to find out."""
    return any(cls.__name__ == "WandbLogger" for cls in type(logger).__mro__)


def is_count_key(key: str) -> bool:
    """``val/num_pairs``, ``test/num_queries``: sizes of the evaluated problem, not scores."""
    return key.rsplit("/", 1)[-1].startswith("num_")


def _wandb_logger_class():
    from lightning.pytorch.loggers import WandbLogger

    class RLGapWandbLogger(WandbLogger):
        """W&B logger whose count keys (``*/num_*``) go to the run summary, not the charts.

        A count is a property of the evaluated set (``val/num_pairs``), with no better or
        worse direction: it is shown in the runs table, not plotted as a metric. Lightning's
        ``anonymous`` argument, which W&B no longer reads (and warns about), is not passed.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._wandb_init.pop("anonymous", None)

        @rank_zero_only
        def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
            counts = {k: v for k, v in metrics.items() if is_count_key(k)}
            if counts:
                self.experiment.summary.update({k: _number(v) for k, v in counts.items()})
            rest = {k: v for k, v in metrics.items() if k not in counts}
            if rest:
                super().log_metrics(rest, step)

    return RLGapWandbLogger


def _number(value: Any) -> Any:
    value = value.item() if hasattr(value, "item") else value
    return int(value) if isinstance(value, float) and value.is_integer() else value


def describe_outputs(trainer: L.Trainer) -> str:
    """Human summary of a finished run's folders: logs, config, checkpoints, plots, W&B."""
    lines = [f"rl-gap outputs in {trainer.default_root_dir}:"]
    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger):
            log_dir = Path(logger.log_dir)
            lines.append(f"  metrics (CSV)  {log_dir / 'metrics.csv'}")
            if (log_dir / "config.yaml").exists():
                lines.append(f"  config         {log_dir / 'config.yaml'}")
            if (log_dir / "plots").exists():
                lines.append(f"  plots          {log_dir / 'plots'}")
        elif is_wandb_logger(logger):
            run = logger.experiment
            run_dir = Path(getattr(run, "dir", "") or logger.save_dir).parent
            if getattr(getattr(run, "settings", None), "mode", "") == "offline" or getattr(
                run, "offline", False
            ):
                lines.append(f"  W&B (offline)  {run_dir}   upload: wandb sync {run_dir}")
            else:
                lines.append(f"  W&B            {getattr(run, 'url', run_dir)}")
    for cb in trainer.checkpoint_callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.dirpath:
            lines.append(f"  checkpoints    {cb.dirpath}")
            if cb.last_model_path:
                lines.append(f"    last         {cb.last_model_path}")
            if cb.best_model_path and cb.monitor:
                lines.append(f"    best ({cb.monitor}) {cb.best_model_path}")
    return "\n".join(lines)


quiet_third_party_tips()
