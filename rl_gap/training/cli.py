"""LightningCLI for training recipes: ``rl-gap fit|validate|test|predict --config recipe.yaml``.

Every recipe key can be overridden on the command line
(``--model.loss.name msap``, ``--trainer.devices 8``); unknown keys are
rejected by jsonargparse. On top of Lightning's defaults this CLI sets up:

- an output folder per run configuration:
  ``<output_dir>/<recipe folder>/<recipe name>/seed<N>[-<hash>]``
  (``runs/metric_learning/sop_gsap/seed0``), where ``<hash>`` (8 hex digits)
  identifies the command-line overrides that change training
  (``rl_gap.training.run_config``), so every override combination and seed has its own
  folder and ``--ckpt_path last`` never picks up another configuration's
  checkpoint; ``--run_name NAME`` uses ``<output_dir>/NAME`` instead, and a
  recipe's ``trainer.default_root_dir`` wins over both;
- a fresh fit never writes into a folder that holds a saved run: it gets a new version
  folder (``seed0-v2``; ``rl_gap.training.run_folder``); a recipe without a seed runs in
  ``seedauto[-<hash>]`` with its drawn seed recorded in its checkpoints;
- checkpoint resolution by the run (``rl_gap.training.run_checkpoint``): ``--ckpt_path
  last`` uses the newest version holding a checkpoint, continues a run whose changed keys
  do not change the objective (``max_epochs``) or refuses naming the candidates; a requeued
  job (Lightning's ``hpc_ckpt_<n>.ckpt``) resumes; ``validate``/``test``/``predict`` without
  a checkpoint are refused unless ``--initial_weights true``;
- every random stream of every rank in each checkpoint, restored on resume
  (``rl_gap.training.rng_state``): a model with dropout resumes bit-identically;
- loggers, unless the recipe lists its own: CSV always (``version_N/metrics.csv``,
  the resolved config in ``version_N/config.yaml``) and W&B, online where W&B finds
  credentials (``wandb login``, ``WANDB_API_KEY``), else *offline* (never waits for a
  network; one line says which), its files inside the run folder, the whole resolved
  config as the W&B config, named after the recipe and the changed keys; a fresh fit
  gets a new W&B id and group, only a resumed fit continues the id its checkpoint
  recorded, and ``validate``/``test``/``predict`` log to W&B runs of their own in the
  training run's group (``rl_gap.training.loggers.wandb_run_for``); ``--wandb_entity``,
  ``--wandb_tags``, ``--wandb_group``; ``--wandb off`` drops it;
- the DataModule follows the model's preprocessing (``rl_gap.data.preprocess``): printed
  in one line and recorded in the run's config (``data.init_args.preprocess``); the
  global batch's per-device share printed at start-up;
- a warning before the first step when the schedule never validates
  (``rl_gap.training.schedule_check``); throughput keys ``perf/*``
  (``rl_gap.callbacks.speed``);
- a rich progress bar, a learning-rate monitor and checkpoints
  (``<run>/checkpoints``, ``last.ckpt`` kept, so ``--ckpt_path last`` resumes);
- fault tolerance (``rl_gap.training.fault_tolerance``): the checkpoint folder
  is checked writable before the first step, ``last.ckpt`` is written every
  ``--checkpoint_every_n_steps`` steps and on SIGTERM (then the command exits
  with status 143), every checkpoint is written atomically in its own folder
  (``rl_gap.training.checkpoint_io``), ``--ckpt_path last`` skips a damaged ``last.ckpt``
  for the newest readable checkpoint (with a warning naming both), and resuming a checkpoint
  of a different configuration is refused with the differing keys named, unless
  ``--force_resume true`` (``rl_gap.training.resume``);
- clear errors before anything is built: an empty or missing config file, a
  ``--ckpt_path`` that is not a checkpoint, a loss name or key the loss
  registry does not know (also under ``--print_config``); a bad loss or optimizer
  value (``temperature: 0``, ``lr: -1``) as one line naming the key when the module
  is built (``rl_gap.training.run_setup``);
- one run per run folder: ``fit`` holds ``<run>/.rl_gap.lock`` (``rl_gap.training.run_lock``)
  for its lifetime, and a second run into the folder exits 2 naming the holder;
- a summary of where every output went, printed when the command ends.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning as L
from jsonargparse import Namespace
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.multiprocessing import ProcessExitedException

from rl_gap.models.pretrained import weights_from_checkpoint
from rl_gap.modules.base import RankingModule
from rl_gap.modules.split_batch import batchnorm_micro_batch_error
from rl_gap.training.checkpoint_io import CheckpointWriteError
from rl_gap.training.fault_tolerance import (
    SIGTERM_EXIT_CODE,
    FaultTolerance,
    RestoreLoaderPosition,
    writable_error,
)
from rl_gap.training.loggers import (
    WandbMode,
    WandbRun,
    default_loggers,
    describe_outputs,
    is_wandb_logger,
    readable_run_name,
    record_run_id,
    resolve_wandb_mode,
    wandb_run_for,
)
from rl_gap.training.parser import (
    RLGapArgumentParser,
    config_file_args,
    joined_negative_values,
    with_shipped_recipes,
)
from rl_gap.training.resume import Resume
from rl_gap.training.rng_state import ResumeRandomState
from rl_gap.training.run_config import check_config_file
from rl_gap.training.run_folder import FreshFitGuard, versioned_message
from rl_gap.training.run_lock import RunFolderLocked, RunLock, starts_the_run
from rl_gap.training.run_setup import RunSetup, resolve_run, setting_error, usage_error
from rl_gap.training.signals import (
    STOP_EXIT_CODES,
    ignoring_sigterm,
    report_workers_stopped,
    sigterm_safe_launch,
)
from rl_gap.training.stop_request import (
    clear_stop_request,
    die_with_launcher,
    listen_for_sigterm,
    stop_requested,
)
from rl_gap.training.trainer_args import restore_integers, written_integers
from rl_gap.training.trainer_setup import (
    batch_ranks_error,
    default_callbacks,
    with_atomic_checkpoint_io,
)

_fail = usage_error


def cfg_seed(config: Any) -> Any:
    """The resolved ``seed_everything`` of a parsed command line."""
    sub = config.get("subcommand")
    return (config[sub] if sub else config).get("seed_everything")


def check_batch_divides_ranks(trainer: L.Trainer, datamodule: Any) -> None:
    """A global batch the ranks cannot share is refused before any process is started."""
    problem = batch_ranks_error(trainer, datamodule)
    if problem:
        _fail(problem)


def batch_share_line(trainer: L.Trainer, datamodule: Any) -> str | None:
    """``batch: 4096 global (the batch the loss ranks) = 8 ranks x 512 per device``."""
    batch = getattr(datamodule, "batch_size", None)
    if not getattr(datamodule, "batch_is_global", False) or not isinstance(batch, int):
        return None
    world = int(getattr(trainer, "num_devices", 1) or 1) * int(
        getattr(trainer, "num_nodes", 1) or 1
    )
    return (
        f"batch: {batch} global (the batch the loss ranks) = {world} rank(s) x "
        f"{batch // world} per device"
    )


class RLGapCLI(LightningCLI):
    """LightningCLI with rl_gap's output folder, loggers and callbacks (see module docstring)."""

    _run: RunSetup | None = None
    _resume: Resume | None = None
    _fault_tolerance: FaultTolerance | None = None
    _lock: RunLock | None = None
    _written_integers: dict[str, int] = {}  # replaced per instance by parse_arguments

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # a SIGTERM from here on is recorded and acted on (never a traceback or a lost save)
        listen_for_sigterm()
        die_with_launcher()
        kwargs.setdefault("parser_class", RLGapArgumentParser)
        super().__init__(*args, **kwargs)

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
            help="W&B logging (auto: online with W&B credentials, e.g. after `wandb login`, "
            "else offline)",
        )
        parser.add_argument("--wandb_project", type=str, default="rl_gap", help="W&B project")
        parser.add_argument(
            "--wandb_entity", type=str | None, default=None, help="W&B entity (user or team)"
        )
        parser.add_argument(
            "--wandb_tags", type=list[str] | None, default=None, help="W&B run tags"
        )
        parser.add_argument(
            "--wandb_group", type=str | None, default=None, help="W&B group (e.g. a sweep)"
        )
        parser.add_argument(
            "--checkpoint_every_n_steps",
            type=int,
            default=1000,
            help="write <run>/checkpoints/last.ckpt every N optimizer steps, independent of "
            "validation (0: only at validation/epoch ends and on SIGTERM)",
        )
        parser.add_argument(
            "--force_resume",
            type=bool,
            default=False,
            help="resume a checkpoint written by a different configuration (differing keys "
            "are printed as a warning instead of an error)",
        )
        parser.add_argument(
            "--initial_weights",
            type=bool,
            default=False,
            help="validate/test/predict: evaluate the model as built (random or pretrained "
            "initial weights) when no --ckpt_path is given (otherwise refused)",
        )

    def _settings(self) -> dict[str, Any]:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        keys = (
            "config", "output_dir", "run_name", "wandb", "wandb_project", "wandb_entity",
            "wandb_tags", "wandb_group", "checkpoint_every_n_steps", "force_resume",
        )  # fmt: skip
        return {k: cfg.get(k) for k in keys}

    # ------------------------------------------------- parsing and run identity
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        if args is None or isinstance(args, (list, tuple)):
            words = with_shipped_recipes([str(w) for w in (sys.argv[1:] if args is None else args)])
            args = words = joined_negative_values(words)
            for path in config_file_args(words):
                try:
                    check_config_file(path)
                except (FileNotFoundError, ValueError) as err:
                    _fail(str(err))
            self._written_integers = written_integers(words, config_file_args(words))
        # parsed here, not by LightningCLI.parse_arguments: the words are the command line
        # (given or sys.argv's), so its "both args and command line arguments" warning
        # would be about the same words twice
        if isinstance(args, (dict, Namespace)):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)
        self._run = resolve_run(parser, self.config)
        self._resume = self._run.resume

    def _parse_ckpt_path(self) -> None:
        """Lightning replaces the model's settings by the checkpoint's; a fit keeps its own.

        A resumed fit trains with the settings its command line states (the resume checks
        allow only changes that are applied, ``rl_gap.training.run_checkpoint``);
        ``validate``/``test``/``predict`` refuse ``model`` overrides the checkpoint's weights
        cannot take, so taking the checkpoint's settings changes nothing the user asked for.
        """
        if self.config.get("subcommand") == "fit":
            return
        super()._parse_ckpt_path()

    def instantiate_classes(self) -> None:
        """Build the data, model and trainer; a bad loss or optimizer value is one line.

        validate/test/predict --ckpt_path: the checkpoint replaces every weight, so named
        pretrained weights are not fetched (rl_gap.models.pretrained.weights_from_checkpoint).
        """
        sub = self.config.get("subcommand")
        evaluating = sub in ("validate", "test", "predict") and self.config[sub].get("ckpt_path")
        try:
            with weights_from_checkpoint(bool(evaluating)):
                super().instantiate_classes()
        except ValueError as err:
            problem = setting_error(err)
            if problem is None:
                raise
            _fail(problem)

    # ----------------------------------------------------------------- trainer
    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> L.Trainer:
        s = self._settings()
        run = self._run
        assert run is not None, "parse_arguments resolves the run before classes are built"
        self._adopt_preprocess(run)
        root = Path(run.root)
        restore_integers(config, self._written_integers)
        problem = writable_error(root)  # before the lock, the logs and W&B touch it
        if problem:
            _fail(problem.replace("checkpoint folder", "run folder", 1))
        if self.subcommand in (None, "fit") and starts_the_run():
            if run.versioned_from is not None:
                note = versioned_message(run.versioned_from, root)
                if note:
                    sys.stderr.write(note + "\n")
            # before anything is written into the folder (wandb_id, config.yaml, logs)
            try:
                self._lock = RunLock(root).acquire()
            except RunFolderLocked as err:
                _fail(str(err))
        config["default_root_dir"] = str(root)
        wandb_id = None
        if config.get("logger") in (None, True):
            wandb_run = None
            if resolve_wandb_mode(s["wandb"]) != "off":
                wandb_run = self._wandb_run(root, s["wandb_group"])
                wandb_id = wandb_run.id
            config["logger"] = default_loggers(
                root,
                readable_run_name(
                    s["config"], cfg_seed(self.config), run.changed, self.subcommand, folder=root
                ),
                s["wandb"], s["wandb_project"],
                wandb_run=wandb_run, entity=s["wandb_entity"], tags=s["wandb_tags"],
                config=run.full,
            )  # fmt: skip
        config["plugins"] = with_atomic_checkpoint_io(config.get("plugins"))
        config["callbacks"] = default_callbacks(config, root)
        config["callbacks"].append(RestoreLoaderPosition())
        config["callbacks"].append(ResumeRandomState())
        if config.get("enable_checkpointing") is not False:
            dirs = [
                cb.dirpath
                for cb in config["callbacks"]
                if isinstance(cb, ModelCheckpoint) and cb.save_last and cb.dirpath
            ]
            self._fault_tolerance = FaultTolerance(
                dirs[0] if dirs else root / "checkpoints",
                every_n_steps=s["checkpoint_every_n_steps"],
                run_config=run.config,
                wandb_id=wandb_id,
                force_resume=bool(s["force_resume"]),
            )
            config["callbacks"].append(self._fault_tolerance)
            config["callbacks"].append(FreshFitGuard(self._fault_tolerance.dirpath, wandb_id))
        from rl_gap.data.metric_learning import MetricLearningDataModule

        if isinstance(self.datamodule, MetricLearningDataModule) or getattr(
            self.datamodule, "shards_training_batches", False
        ):
            # The resumable training loaders shard the global batch themselves.
            config["use_distributed_sampler"] = False
        return super()._instantiate_trainer(config, callbacks)

    def _adopt_preprocess(self, run: RunSetup) -> None:
        """The DataModule follows the model's preprocessing; the values in use are printed
        and recorded in the run's config (``data.init_args.preprocess``) and W&B config."""
        from rl_gap.data.preprocess import adopt_model_preprocess

        pp = adopt_model_preprocess(self.datamodule, self.model)
        if pp is None:
            return
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        if cfg.get("data.init_args") is not None and "preprocess" in cfg["data.init_args"]:
            cfg["data.init_args.preprocess"] = pp.settings()
            run.full["data.init_args.preprocess"] = pp.settings()
        if rank_zero_only.rank == 0:
            sys.stderr.write(pp.describe() + "\n")

    def _wandb_run(self, root: Path, group: str | None) -> WandbRun:
        """This command's W&B run (a fit records its id in ``<root>/wandb_id``)."""
        resume = self._resume
        ckpt = None if resume is None else str(resume.path)
        if resume is None and self.subcommand not in (None, "fit"):
            ckpt = self.config[self.subcommand].get("ckpt_path")  # best/hpc/registry: as given
        run = wandb_run_for(
            self.subcommand, root, ckpt, None if resume is None else resume.wandb_id, group
        )
        if run.job_type == "train" and starts_the_run():
            record_run_id(root, run.id, run.group)
        return run

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            self._run_with_sigterm_exit(subcommand)
        finally:
            if self._lock is not None:
                self._lock.release()

    def _run_with_sigterm_exit(self, subcommand: str) -> None:
        launcher = self.trainer.strategy.launcher
        self._stop_if_requested("before training started: nothing to save")
        check_batch_divides_ranks(self.trainer, self.datamodule)
        if subcommand == "fit":
            problem = batchnorm_micro_batch_error(
                self.model, getattr(self.model, "micro_batch_size", None)
            )
            if problem:
                _fail(f"--model.init_args.{problem}")
        line = batch_share_line(self.trainer, self.datamodule) if subcommand == "fit" else None
        if line and rank_zero_only.rank == 0:
            sys.stderr.write(line + "\n")
        for logger in self.trainer.loggers:  # the launcher and its ranks agree on version_N
            getattr(logger, "version", None)
        try:
            with sigterm_safe_launch(launcher):
                super()._run_subcommand(subcommand)
        except SIGTERMException as err:
            # a killed job must not look successful (FaultTolerance wrote the checkpoint)
            self._finish_wandb()
            ft = self._fault_tolerance
            if ft is None or ft.sigterm_checkpoint is None:
                if ft is None or not ft._stopped_before_start:
                    sys.stderr.write("rl-gap: SIGTERM received; no checkpoint was written\n")
            with ignoring_sigterm():  # stopping already: a second SIGTERM must not cut it short
                report_workers_stopped(launcher)
            clear_stop_request()
            code = err.code if isinstance(err.code, int) else SIGTERM_EXIT_CODE
            raise SystemExit(code if code in STOP_EXIT_CODES else SIGTERM_EXIT_CODE) from None
        except CheckpointWriteError as err:
            # a full disk mid-run: one line (the previous checkpoint is intact), not 3 tracebacks
            self._finish_wandb()
            clear_stop_request()
            sys.stderr.write(f"rl-gap: error: {err.strerror or err}\n")
            raise SystemExit(1) from None
        except ProcessExitedException as err:
            code = err.exit_code if err.exit_code in STOP_EXIT_CODES else 128 - err.exit_code
            if code not in STOP_EXIT_CODES:  # neither saved-and-stopped nor killed while starting
                raise
            with ignoring_sigterm():
                report_workers_stopped(launcher)  # ddp_spawn: the workers stopped
            clear_stop_request()
            raise SystemExit(code) from None
        self._stop_if_requested("after training had ended: the run's outputs are complete")

    @staticmethod
    def _stop_if_requested(when: str) -> None:
        """A SIGTERM/Ctrl-C recorded outside the training loop: exit 143/130 with one line."""
        signum = stop_requested()
        if signum is None:
            return
        clear_stop_request()
        name = "SIGTERM" if signum == 15 else "SIGINT" if signum == 2 else f"signal {signum}"
        sys.stderr.write(f"rl-gap: {name} {when}\n")
        raise SystemExit(128 + signum)

    # ------------------------------------------------------ where outputs went
    def after_fit(self) -> None:
        self._print_outputs()

    def after_validate(self) -> None:
        self._print_outputs()

    def after_test(self) -> None:
        self._print_outputs()

    def after_predict(self) -> None:
        self._finish_wandb()  # the embedding writer names its own outputs

    @rank_zero_only
    def _print_outputs(self) -> None:
        print(describe_outputs(self.trainer))
        self._finish_wandb()

    @rank_zero_only
    def _finish_wandb(self) -> None:
        # One command = one W&B run: close it, or the next fit in this process
        # (the demo, notebooks) would log into it.
        for logger in self.trainer.loggers:
            if is_wandb_logger(logger) and logger._experiment is not None:
                logger.experiment.finish()


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
