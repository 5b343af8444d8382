"""LightningCLI for training recipes: ``rl-gap fit|validate|test|predict --config recipe.yaml``.

Every recipe key can be overridden on the command line
(``--model.loss.name msap``, ``--trainer.devices 8``); unknown keys are
rejected by jsonargparse. On top of Lightning's defaults this CLI sets up:

- an output folder per run: ``<output_dir>/<recipe folder>/<recipe name>``
  (``runs/metric_learning/sop_gsap``), or ``trainer.default_root_dir`` when
  a recipe sets it; ``--run_name`` picks another name;
- loggers, unless the recipe lists its own: CSV always (``version_N/metrics.csv``)
  and W&B, *offline* unless ``WANDB_API_KEY`` is set (never waits for a network),
  its files inside the run folder; ``--wandb off`` drops it;
- a rich progress bar, a learning-rate monitor and checkpoints
  (``<run>/checkpoints``, ``last.ckpt`` kept, so ``--ckpt_path last`` resumes);
- a summary of where every output went, printed when the command ends.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import lightning as L
from lightning.pytorch.callbacks import (
    Callback,
    LearningRateMonitor,
    ModelCheckpoint,
    ProgressBar,
    RichProgressBar,
)
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.utilities import rank_zero_only

from rl_gap.modules.base import RankingModule

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


def run_dir_for(config_files: list[Any] | None, output_dir: str, run_name: str | None) -> Path:
    """``<output_dir>/<recipe folder>/<recipe stem>`` (or ``<output_dir>/<run_name>``)."""
    if run_name:
        return Path(output_dir) / run_name
    if config_files:
        recipe = Path(str(config_files[-1]))
        return Path(output_dir) / recipe.parent.name / recipe.stem
    return Path(output_dir) / "run"


def default_loggers(root: Path, name: str, wandb_mode: str, project: str) -> list[Logger]:
    """CSV logger under ``root/version_N`` plus, unless off, a W&B logger in ``root/wandb``."""
    loggers: list[Logger] = [CSVLogger(save_dir=str(root), name="")]
    mode = resolve_wandb_mode(wandb_mode)
    if mode != "off":
        from lightning.pytorch.loggers import WandbLogger

        root.mkdir(parents=True, exist_ok=True)
        loggers.append(
            WandbLogger(
                project=project,
                name=name,
                save_dir=str(root),
                offline=mode == "offline",
                log_model=False,
                settings=_wandb_settings(),
            )
        )
    return loggers


def _wandb_settings():
    import wandb

    # Offline runs must never block on the network; keep wandb's console quiet.
    return wandb.Settings(silent=True, console="off", x_disable_stats=True)


class RLGapCLI(LightningCLI):
    """LightningCLI with rl_gap's output folder, loggers and callbacks (see module docstring)."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--output_dir", type=str, default="runs", help="root of all run folders"
        )
        parser.add_argument(
            "--run_name", type=str | None, default=None, help="run folder under output_dir"
        )
        parser.add_argument(
            "--wandb",
            type=WandbMode,
            default="auto",
            help="W&B logging (auto: offline w/o API key)",
        )
        parser.add_argument("--wandb_project", type=str, default="rl_gap", help="W&B project")

    def _settings(self) -> dict[str, Any]:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        return {
            k: cfg.get(k) for k in ("config", "output_dir", "run_name", "wandb", "wandb_project")
        }

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> L.Trainer:
        s = self._settings()
        root = Path(
            config.get("default_root_dir")
            or run_dir_for(s["config"], s["output_dir"], s["run_name"])
        )
        config["default_root_dir"] = str(root)
        if config.get("logger") in (None, True):
            config["logger"] = default_loggers(root, root.name, s["wandb"], s["wandb_project"])
        config["callbacks"] = self._default_callbacks(config, root)
        from rl_gap.data.metric_learning import MetricLearningDataModule

        if isinstance(self.datamodule, MetricLearningDataModule):
            # The m-per-class batch sampler shards the global batch itself.
            config["use_distributed_sampler"] = False
        return super()._instantiate_trainer(config, callbacks)

    @staticmethod
    def _default_callbacks(config: dict[str, Any], root: Path) -> list[Callback]:
        given = config.get("callbacks") or []
        given = list(given) if isinstance(given, list) else [given]
        if config.get("enable_progress_bar") is not False and not any(
            isinstance(c, ProgressBar) for c in given
        ):
            given.append(RichProgressBar(leave=True))
        if config.get("logger") and not any(isinstance(c, LearningRateMonitor) for c in given):
            given.append(LearningRateMonitor(logging_interval="step"))
        checkpoints = [c for c in given if isinstance(c, ModelCheckpoint)]
        for cb in checkpoints:  # one folder per run, so that --ckpt_path last finds it
            if cb.dirpath is None:
                cb.dirpath = str(root / "checkpoints")
        if config.get("enable_checkpointing") is not False and not checkpoints:
            given.append(ModelCheckpoint(dirpath=str(root / "checkpoints"), save_last=True))
        return given

    # ------------------------------------------------------ where outputs went
    def after_fit(self) -> None:
        self._print_outputs()

    def after_validate(self) -> None:
        self._print_outputs()

    def after_test(self) -> None:
        self._print_outputs()

    @rank_zero_only
    def _print_outputs(self) -> None:
        print(describe_outputs(self.trainer))
        # One command = one W&B run: close it, or the next fit in this process
        # (the demo, notebooks) would log into it.
        for logger in self.trainer.loggers:
            if type(logger).__name__ == "WandbLogger" and logger._experiment is not None:
                logger.experiment.finish()


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


def run_lightning_cli(argv: list[str] | None = None, run: bool = True) -> RLGapCLI:
    """Build (and by default run) the CLI; ``argv`` like the command line after ``rl-gap``."""
    return RLGapCLI(
        RankingModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=argv,
        run=run,
        auto_configure_optimizers=False,
        # no argparse prefix matching: a truncated key (--trainer.max_epoch) is a typo
        parser_kwargs={"allow_abbrev": False},
        save_config_kwargs={"overwrite": True},
    )
