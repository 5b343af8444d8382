"""Runs that survive faults: a writable checkpoint folder, step and SIGTERM checkpoints, config checks.

:class:`FaultTolerance` (added by ``rl-gap fit``) does four things:

- before the first step, checks that the checkpoint folder can be written
  (rank 0 checks, every rank raises the same error);
- every ``every_n_steps`` optimizer steps, writes ``last.ckpt`` (independent
  of validation), so a killed job loses at most N steps;
- on SIGTERM (what SLURM and Kubernetes send before a kill) writes ``last.ckpt``
  mid-epoch and ends the fit with ``SIGTERMException(143)``; ``rl-gap`` exits with
  status 143. The signal handler only sets a flag (it replaces Lightning's, which
  forwards the signal and runs a collective inside the handler, and hangs or crashes
  DDP when one process is signalled); after every optimizer step the processes
  agree on it with one collective (any process signalled: all stop), all save
  the same step once and stop together. The training sampler's
  position is part of every checkpoint (``rl_gap.data.sampler.ResumableBatchLoader``),
  so ``--ckpt_path last`` continues with exactly the batches the uninterrupted run would see;
- :class:`RestoreLoaderPosition` hands the training loader its checkpointed
  position back (Lightning saves it but does not restore it here); ``rl-gap``
  adds it to every run, a ``Trainer`` built in Python needs it in its callbacks
  for an exact mid-epoch resume;
- stores the run's training config (``rl_gap.training.run_config.training_config``) and
  W&B id in every checkpoint and, when fitting, refuses to resume a checkpoint
  whose config differs (naming the keys) unless ``force_resume``.

``last.ckpt`` is written to a temporary file in its own folder and renamed
(:mod:`rl_gap.training.checkpoint_io`), so a kill during the write never destroys the
previous one; temporary files left by a killed write are removed at the next fit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader

from rl_gap.training.checkpoint_io import AtomicCheckpointIO, remove_partial_checkpoints
from rl_gap.training.loader_position import (  # re-exported: Python Trainers import it here
    RestoreLoaderPosition,  # noqa: F401
    training_loaders,
)
from rl_gap.training.resume import nonfinite_optimizer_error
from rl_gap.training.run_checkpoint import split_differences
from rl_gap.training.run_config import (
    ResumeMismatchError,
    config_mismatch,
    nonfinite_weights_error,
    resume_mismatch_message,
)
from rl_gap.training.stop_request import (
    ShieldedWorkerInit,
    clear_stop_request,
    die_with_launcher,
    listen_for_sigterm,
    note_training_started,
    request_stop,
    stop_requested,
)

SIGTERM_EXIT_CODE = 128 + 15  # what a shell reports for a process ended by SIGTERM


def writable_error(folder: str | Path) -> str | None:
    """None if ``folder`` can be created and written, else a message naming it and why."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".rl_gap_write_test_{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        return (
            f"checkpoint folder {folder} cannot be written ({reason}: {err.filename or folder}); "
            "choose another --output_dir / --run_name or fix the folder's permissions"
        )
    return None


class FaultTolerance(Callback):
    """Writable-folder check, ``last.ckpt`` every N steps and on SIGTERM, config record + check.

    Args:
        dirpath: checkpoint folder (``<run>/checkpoints``); ``last.ckpt`` is written there.
        every_n_steps: write ``last.ckpt`` every this many optimizer steps (0/None: never).
        run_config: the run's flat training config, stored in checkpoints and
            compared with a checkpoint's when resuming a fit.
        wandb_id: W&B run id, stored in checkpoints so a resumed run continues its dashboard.
        force_resume: resume a checkpoint of a different config (with a warning).
    """

    def __init__(
        self,
        dirpath: str | Path,
        every_n_steps: int | None = None,
        run_config: dict[str, Any] | None = None,
        wandb_id: str | None = None,
        force_resume: bool = False,
    ) -> None:
        if every_n_steps is not None and every_n_steps < 0:
            raise ValueError(f"every_n_steps must be >= 0, got {every_n_steps}")
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps or 0
        self.run_config = run_config
        self.wandb_id = wandb_id
        self.force_resume = force_resume
        self.sigterm_checkpoint: Path | None = None
        self.sigterm_pending = False  # set by the signal handler, acted on at a step boundary
        self.stop_signum = signal.SIGTERM  # what stopped the fit (SIGINT: Ctrl-C)
        self._last_saved_step = -1
        self.changes: list[dict[str, Any]] = []  # continuable keys changed on resume
        self._stopped_before_start = False
        self._wrapped_hooks: list[tuple[Any, str]] = []
        self._previous_sigint: Any = None

    @property
    def exit_code(self) -> int:
        """The status ``rl-gap`` exits with after a stop: 143 (SIGTERM) or 130 (Ctrl-C)."""
        return 128 + int(self.stop_signum)

    def _note_sigterm(self, signum: int, frame: Any) -> None:
        # Only a flag: a signal handler runs between two bytecodes of whatever the
        # process is doing (possibly inside a collective), so it must not communicate.
        if not self.sigterm_pending:
            self.stop_signum = signal.Signals(signum)
        self.sigterm_pending = True
        request_stop(signum)

    # ------------------------------------------------------------------ checks
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.sigterm_pending, self.sigterm_checkpoint = False, None
        self.stop_signum = signal.SIGTERM
        self._stopped_before_start = False
        # A SIGTERM from now until Lightning installs its handler (just before the first
        # step) is recorded too, and acted on before the first step (on_train_start).
        listen_for_sigterm()
        die_with_launcher()  # a rank of rl-gap's launcher never outlives it
        # runs in every training process, before Lightning registers its SIGTERM handler:
        # make it register ours instead (other handlers already installed are still chained)
        trainer._signal_connector._sigterm_notifier_fn = self._note_sigterm
        self._shield_loader_workers(trainer, pl_module)
        error = None
        if trainer.is_global_zero:
            error = writable_error(self.dirpath)
            remove_partial_checkpoints(self.dirpath)  # left by a write that was killed
        error = trainer.strategy.broadcast(error, src=0)
        if error:
            raise PermissionError(error)

    def _shield_loader_workers(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """DataLoader workers outlive a SIGTERM to the whole process tree (the save needs them)."""
        from lightning.pytorch.utilities.model_helpers import is_overridden

        for owner in (trainer.datamodule, pl_module):
            for name in ("train_dataloader", "val_dataloader"):
                if owner is None or not is_overridden(name, owner):
                    continue
                if getattr(getattr(owner, name), "_rl_gap_shielded", False):
                    continue
                setattr(owner, name, _shielding(getattr(owner, name)))
                self._wrapped_hooks.append((owner, name))

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for owner, name in self._wrapped_hooks:
            with contextlib.suppress(AttributeError):
                delattr(owner, name)
        self._wrapped_hooks = []
        self._restore_sigint()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if threading.current_thread() is threading.main_thread():
            # Ctrl-C: save at the next step and exit 130 (a second Ctrl-C interrupts at once)
            self._previous_sigint = signal.signal(signal.SIGINT, self._note_sigint)
        note_training_started()  # from here a stop is agreed on and saved, not cut short
        early = stop_requested()
        if early is not None and not self.sigterm_pending:
            self._note_sigterm(early, None)  # arrived while the run was starting
        if trainer.strategy.reduce_boolean_decision(self.sigterm_pending, all=False):
            # before the first step of this fit: nothing new to save (a resumed run's
            # checkpoint is untouched); every process stops together
            clear_stop_request()
            _ignore_further_sigterms()
            self._stopped_before_start = True
            if trainer.is_global_zero:
                print(
                    f"rl-gap: {self.stop_signum.name} while the run was starting (before "
                    f"step {trainer.global_step + 1}): nothing new to save; stopped",
                    file=sys.stderr,
                    flush=True,
                )
            trainer._signal_connector.received_sigterm = True
            raise SIGTERMException(self.exit_code)

    def _note_sigint(self, signum: int, frame: Any) -> None:
        self._restore_sigint()
        self._note_sigterm(signum, frame)

    def _restore_sigint(self) -> None:
        if self._previous_sigint is not None and (
            threading.current_thread() is threading.main_thread()
        ):
            signal.signal(signal.SIGINT, self._previous_sigint)
        self._previous_sigint = None

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint["rl_gap"] = {
            "config": self.run_config, "wandb_id": self.wandb_id, "changes": self.changes,
        }  # fmt: skip

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        nonfinite = nonfinite_weights_error(checkpoint, trainer.ckpt_path or "the checkpoint")
        if nonfinite:
            raise ValueError(nonfinite)
        if trainer.state.fn != "fit":
            return
        nonfinite = nonfinite_optimizer_error(checkpoint, trainer.ckpt_path or "the checkpoint")
        if nonfinite:
            raise ValueError(nonfinite)
        if self.run_config is None:
            return
        saved = (checkpoint.get("rl_gap") or {}).get("config")
        path = trainer.ckpt_path or "the checkpoint"
        if saved is None:
            warnings.warn(
                f"{path} holds no rl_gap config record (written by an older version or by "
                "plain Lightning); cannot check that it comes from the same configuration",
                UserWarning,
                stacklevel=2,
            )
            return
        other, changed = split_differences(saved, self.run_config)
        # a continued run's history of changed keys (max_epochs, ...), kept in the run
        self.changes = list((checkpoint.get("rl_gap") or {}).get("changes") or [])
        if changed:
            step = checkpoint.get("global_step")
            self.changes.append({"step": step, "keys": {k: list(v) for k, v in changed.items()}})
        diff = config_mismatch(
            {k: saved[k] for k in other if k in saved},
            {k: self.run_config[k] for k in other if k in self.run_config},
        )
        if diff is None:
            return
        if not self.force_resume:
            raise ResumeMismatchError(resume_mismatch_message(path, diff))
        warnings.warn(
            f"--force_resume: resuming {path} written by a different configuration:\n{diff}",
            UserWarning,
            stacklevel=2,
        )

    # ------------------------------------------------------------ checkpoints
    def save_last(self, trainer: L.Trainer) -> Path:
        """Write ``<dirpath>/last.ckpt`` atomically (all ranks call it; rank 0 writes)."""
        path = self.dirpath / "last.ckpt"
        for cb in trainer.checkpoint_callbacks:
            # ModelCheckpoint(save_last=True) keeps overwriting its own last.ckpt
            # (instead of writing last-v1.ckpt next to ours)
            if isinstance(cb, ModelCheckpoint) and cb.save_last and cb.dirpath:
                if Path(cb.dirpath).resolve() == self.dirpath.resolve():
                    cb.last_model_path = str(path)
        if isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO):
            trainer.save_checkpoint(path)  # temp file in the same folder + fsync + rename
        else:
            tmp = path.with_name(path.name + ".tmp")
            trainer.save_checkpoint(tmp)
            if trainer.is_global_zero:
                os.replace(tmp, path)
        self._last_saved_step = trainer.global_step
        return path

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        # one collective per step: every process learns whether any of them was signalled
        if trainer.strategy.reduce_boolean_decision(self.sigterm_pending, all=False):
            self._save_on_sigterm(trainer)
            trainer._signal_connector.received_sigterm = True
            clear_stop_request()
            _ignore_further_sigterms()
            # the exit status travels with the exception, also out of ddp_spawn workers
            raise SIGTERMException(self.exit_code)
        step = trainer.global_step
        if self.every_n_steps and step % self.every_n_steps == 0 and step != self._last_saved_step:
            self.save_last(trainer)

    def _save_on_sigterm(self, trainer: L.Trainer) -> None:
        self.sigterm_checkpoint = self.save_last(trainer)
        if trainer.is_global_zero:
            print(
                f"rl-gap: {self.stop_signum.name} at epoch {trainer.current_epoch}, step {trainer.global_step}: "
                f"saved {self.sigterm_checkpoint}; resume with the same command plus "
                "--ckpt_path last",
                file=sys.stderr,
                flush=True,
            )

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return
        if self._stopped_before_start:
            return
        if self.sigterm_checkpoint is None:  # raised by Lightning itself, not at a step boundary
            self._save_on_sigterm(trainer)


def _shielding(hook: Any) -> Any:
    def shielded_loaders() -> Any:
        loaders = hook()
        for loader in training_loaders(loaders):
            if isinstance(loader, DataLoader) and loader.num_workers > 0:
                if not isinstance(loader.worker_init_fn, ShieldedWorkerInit):
                    loader.worker_init_fn = ShieldedWorkerInit(loader.worker_init_fn)
        return loaders

    shielded_loaders._rl_gap_shielded = True  # type: ignore[attr-defined]
    return shielded_loaders


def _ignore_further_sigterms() -> None:
    """The ranks are stopping: a later SIGTERM (a launcher cleaning up) must not cut that short.

    SIG_IGN, unlike a Python handler, stays in force while the interpreter shuts down
    (Python restores the default action for its own handlers there, and a SIGTERM in
    that window would end the process with -15 instead of 143).
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
