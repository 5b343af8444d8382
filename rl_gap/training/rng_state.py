"""Every random stream of a training process in the checkpoint, so a resume is bit-identical.

A model with dropout (or any random layer) draws from the global generators at every
step: torch's CPU generator, each CUDA device's generator, and, through user code,
NumPy's and Python's. A resumed run that restores weights, optimizer and sampler position
but reseeds those generators draws other dropout masks from the first step on, so its
weights drift from the uninterrupted run's (max |diff| ~1e-4 after a few steps).

:class:`ResumeRandomState` (added by ``rl-gap fit``; a ``Trainer`` built in Python adds it
to its callbacks):

- every checkpoint holds, for every rank, the state of the four streams (CUDA: every
  visible device) at the moment it is written (``checkpoint["rl_gap_rng"]``), gathered
  to rank 0 (which writes the file);
- a resumed fit puts each rank's saved states back just before its first step
  (``on_train_start``), so the steps after the resume draw exactly what the
  uninterrupted run drew;
- so that the streams advance only with training steps, two other consumers get their own
  generators: each training loader creating its iterator (torch draws the DataLoader's base
  seed, hence every worker's seed, from the global generator) uses a private generator
  seeded by ``(seed, epoch)``, and validation inside a fit leaves the streams as it found
  them;
- a resume on a different number of ranks cannot restore per-rank streams: it warns
  that the resume is not bit-identical and goes on.

Pure torch/NumPy/random plus one Lightning callback.
"""

from __future__ import annotations

import os
import random
import warnings
from collections.abc import Mapping
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader

from rl_gap.training.loader_position import training_loaders

__all__ = ["ResumeRandomState", "capture_streams", "restore_streams", "loader_seed"]

CHECKPOINT_KEY = "rl_gap_rng"


def capture_streams() -> dict[str, Any]:
    """The state of torch CPU, every CUDA device, NumPy and Python ``random``."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()  # noqa: NPY002  (the global stream itself)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        # tensors and plain values only: checkpoints stay loadable with weights_only=True
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_streams(state: Mapping[str, Any]) -> None:
    """Put back what :func:`capture_streams` returned (CUDA only if it was saved and is here)."""
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))  # noqa: NPY002
    random.setstate(state["python"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) != torch.cuda.device_count():
            warnings.warn(
                f"the checkpoint holds the random state of {len(cuda)} CUDA device(s), this "
                f"process sees {torch.cuda.device_count()}: CUDA streams are not restored "
                "(the resume is not bit-identical for CUDA dropout)",
                UserWarning,
                stacklevel=2,
            )
        else:
            torch.cuda.set_rng_state_all(cuda)


def loader_seed(seed: int, epoch: int) -> int:
    """The seed of a training loader's private generator in ``epoch`` (same on every host)."""
    return (int(seed) * 1_000_003 + int(epoch) * 7_919 + 12_345) % (2**63 - 1)


def _gather(trainer: L.Trainer, state: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``state``, in rank order (one process: ``[state]``)."""
    if trainer.world_size == 1 or not torch.distributed.is_initialized():
        return [state]
    states: list[Any] = [None] * trainer.world_size
    torch.distributed.all_gather_object(states, state)
    return states


def _train_loaders(trainer: L.Trainer) -> list[DataLoader]:
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    found = training_loaders(combined.flattened) if combined is not None else []
    return [dl for dl in found if isinstance(dl, DataLoader)]


class ResumeRandomState(Callback):
    """Saves every rank's random streams in each checkpoint and restores them on resume.

    Args:
        seed: the run's seed, for the training loaders' private generators (default:
            ``PL_GLOBAL_SEED``, which ``seed_everything`` sets, else 0).
    """

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self._pending: list[dict[str, Any]] | None = None
        self._path = "the checkpoint"
        self._val_state: dict[str, Any] | None = None
        self._generators: dict[int, torch.Generator] = {}
        self._wrapped: Any = None

    def _seed(self) -> int:
        if self.seed is not None:
            return int(self.seed)
        return int(os.environ.get("PL_GLOBAL_SEED", 0))

    # ---------------------------------------------------------------- save
    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # every rank calls this (Trainer.save_checkpoint dumps on all ranks, rank 0 writes)
        checkpoint[CHECKPOINT_KEY] = {"ranks": _gather(trainer, capture_streams())}

    # ------------------------------------------------------------- restore
    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn != "fit":
            return
        self._path = str(trainer.ckpt_path or "the checkpoint")
        record = checkpoint.get(CHECKPOINT_KEY)
        self._pending = None if record is None else list(record.get("ranks") or [])
        if record is None:
            warnings.warn(
                f"{self._path} holds no random-generator state (written by an older version "
                "or by plain Lightning): a model with dropout resumes with other masks "
                "(not bit-identical)",
                UserWarning,
                stacklevel=2,
            )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        states, self._pending = self._pending, None
        if not states:
            return
        if len(states) != trainer.world_size:
            warnings.warn(
                f"{self._path} holds the random streams of {len(states)} rank(s), this run "
                f"has {trainer.world_size}: they are not restored (the resume is exact in "
                "weights, optimizer and batches, but dropout masks differ)",
                UserWarning,
                stacklevel=2,
            )
            return
        # the last thing before the first step: nothing else draws in between
        restore_streams(states[trainer.global_rank])

    # ------------------------------------------- consumers kept off the streams
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._wrap_train_loader_hook(trainer, pl_module)

    def _wrap_train_loader_hook(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Training loaders get a private generator before Lightning first iterates them."""
        from lightning.pytorch.utilities.model_helpers import is_overridden

        owner = trainer.datamodule if trainer.datamodule is not None else pl_module
        if owner is None or not is_overridden("train_dataloader", owner):
            return
        hook = owner.train_dataloader
        if getattr(hook, "_rl_gap_private_generator", False):
            return

        def with_private_generator() -> Any:
            loaders = hook()
            for loader in training_loaders(loaders):
                if isinstance(loader, DataLoader) and loader.generator is None:
                    loader.generator = self._generator_for(loader, trainer.current_epoch)
            return loaders

        with_private_generator._rl_gap_private_generator = True  # type: ignore[attr-defined]
        owner.train_dataloader = with_private_generator  # type: ignore[method-assign]
        self._wrapped = owner

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        owner, self._wrapped = self._wrapped, None
        if owner is not None and "train_dataloader" in vars(owner):
            del owner.train_dataloader

    def _generator_for(self, loader: DataLoader, epoch: int) -> torch.Generator:
        gen = torch.Generator().manual_seed(loader_seed(self._seed(), epoch))
        self._generators[id(loader)] = gen
        return gen

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # before the epoch's iterator is created (epochs after the first of this process)
        for loader in _train_loaders(trainer):
            gen = self._generators.get(id(loader))
            if gen is not None and loader.generator is gen:
                gen.manual_seed(loader_seed(self._seed(), trainer.current_epoch))

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self._val_state = capture_streams()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state, self._val_state = self._val_state, None
        if state is not None:
            restore_streams(state)
