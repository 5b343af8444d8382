"""Where a training run's logs go: CSV + W&B loggers, the W&B run id, the end-of-run summary.

Used by :mod:`rl_gap.training.cli`: W&B is *offline* unless ``WANDB_API_KEY``
is set (it never waits for a network), writes inside the run folder, receives
the whole resolved config, and keeps one run id per run folder
(``<run>/wandb_id``) passed with ``resume="allow"`` so a resumed run continues
its dashboard.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Literal

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.utilities import rank_zero_only

WandbMode = Literal["auto", "online", "offline", "off"]


def resolve_wandb_mode(mode: str) -> str:
    """``auto`` -> ``online`` with a ``WANDB_API_KEY``, else ``offline``; ``WANDB_MODE`` wins."""
    env = os.environ.get("WANDB_MODE", "").lower()
    if env in ("disabled", "off"):
        return "off"
    if mode == "auto":
        if env in ("offline", "dryrun"):
            return "offline"
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    return mode


def wandb_run_id(root: Path, from_checkpoint: str | None = None) -> str:
    """The run folder's W&B id (``<root>/wandb_id``), created on first use.

    A checkpoint's id (resuming a checkpoint from elsewhere) is adopted when the
    folder has none. Only rank 0 writes the file.
    """
    path = root / "wandb_id"
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    run_id = from_checkpoint or secrets.token_hex(4)
    if rank_zero_only.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        path.write_text(run_id + "\n")
    return run_id


def default_loggers(
    root: Path,
    name: str,
    wandb_mode: str,
    project: str,
    wandb_id: str | None = None,
    entity: str | None = None,
    tags: list[str] | None = None,
    group: str | None = None,
    config: dict[str, Any] | None = None,
) -> list[Logger]:
    """CSV logger under ``root/version_N`` plus, unless off, a W&B logger in ``root/wandb``.

    The W&B run gets ``id=wandb_id`` with ``resume="allow"`` (a resumed run
    continues the same dashboard), ``config`` (the whole resolved config) and
    the optional ``entity``, ``tags``, ``group``.
    """
    loggers: list[Logger] = [CSVLogger(save_dir=str(root), name="")]
    mode = resolve_wandb_mode(wandb_mode)
    if mode != "off":
        from lightning.pytorch.loggers import WandbLogger

        root.mkdir(parents=True, exist_ok=True)
        extra: dict[str, Any] = {}
        if wandb_id:
            extra.update(id=wandb_id, resume="allow")
        for key, value in (("entity", entity), ("tags", tags), ("group", group)):
            if value:
                extra[key] = list(value) if key == "tags" else value
        loggers.append(
            WandbLogger(
                project=project,
                name=name,
                save_dir=str(root),
                offline=mode == "offline",
                log_model=False,
                settings=_wandb_settings(),
                config=config,
                **extra,
            )
        )
    return loggers


def _wandb_settings():
    import wandb

    # Offline runs must never block on the network; keep wandb's console quiet.
    return wandb.Settings(silent=True, console="off", x_disable_stats=True)


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
        elif type(logger).__name__ == "WandbLogger":
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
