"""The training loader's checkpointed position, handed back when a fit resumes."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from rl_gap.training.checkpoint_io import Stateful

__all__ = ["RestoreLoaderPosition", "training_loaders"]


def training_loaders(iterables: Any) -> list[Any]:
    """The loaders of a (nested) CombinedLoader iterable: mappings and sequences flattened."""
    if isinstance(iterables, Mapping):
        return [x for v in iterables.values() for x in training_loaders(v)]
    if isinstance(iterables, (list, tuple)):
        return [x for v in iterables for x in training_loaders(v)]
    return [] if iterables is None else [iterables]


class RestoreLoaderPosition(Callback):
    """Gives the training loaders their checkpointed position back when a fit resumes.

    Lightning saves the state of every training loader that has
    ``state_dict``/``load_state_dict`` (``rl_gap.data.sampler.ResumableBatchLoader``)
    but, when ``configure_optimizers`` asks for ``trainer.estimated_stepping_batches``
    (every rl_gap module's schedule does), builds the loaders before the
    checkpoint is read and never hands the states back. This callback reads them
    from the checkpoint and applies them at ``on_train_start``, before the first
    batch is drawn (applying them twice is harmless).
    """

    def __init__(self) -> None:
        self._states: list[dict[str, Any]] = []
        self._resuming = False
        self._path = "the checkpoint"

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._path = trainer.ckpt_path or "the checkpoint"
        if trainer.state.fn == "fit" and not (checkpoint.get("loops") or {}).get("fit_loop"):
            warnings.warn(
                f"{self._path} holds no training-loop state ('loops'; a weights-only or plain "
                "torch.save checkpoint): the fit restarts at epoch 0, step 0 with these weights; "
                "the epoch/step counters, the schedule's position and the sampler position are "
                "lost (not an exact resume)",
                UserWarning,
                stacklevel=2,
            )
        fit_loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
        self._states = list((fit_loop.get("state_dict") or {}).get("combined_loader") or [])
        self._resuming = trainer.state.fn == "fit"

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        states, self._states = self._states, []
        resuming, self._resuming = self._resuming, False
        loaders = [
            dl for dl in training_loaders(trainer.train_dataloader) if isinstance(dl, Stateful)
        ]
        if not states:
            if resuming and loaders:
                warnings.warn(
                    f"{self._path} holds no position of the training sampler: if it was "
                    "written mid-epoch, that epoch restarts at its first batch (batches seen "
                    "twice, not an exact resume)",
                    UserWarning,
                    stacklevel=2,
                )
            return
        if len(loaders) != len(states):
            raise RuntimeError(
                f"the checkpoint holds the position of {len(states)} training loader(s) but "
                f"this run has {len(loaders)} resumable one(s); resume with the same data setup"
            )
        for loader, state in zip(loaders, states, strict=True):
            loader.load_state_dict(state)
