"""Training speed on the dashboard: global samples/s, data-loading time per step, GPU memory.

:class:`TrainingSpeed` (added by ``rl-gap fit`` whenever a logger is on) logs, every
``log_every_n_steps`` optimizer steps, averaged over the steps since its last log:

- ``perf/samples_per_sec``: samples of all processes per second of wall time
  (local batch size x world size / step time);
- ``perf/data_time``: seconds per step the training loop waited between the end of one
  step and the start of the next (the DataLoader, plus Lightning's own per-step work);
- ``perf/step_time``: seconds per step, both together;
- ``perf/gpu_mem_gb``: peak CUDA memory allocated by this process since the last log
  (only where CUDA is in use).

Times are host wall-clock at batch boundaries, without a CUDA synchronisation (which
would slow the run it measures); over many steps the averages are those of the run.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback


def batch_size(batch: Any) -> int | None:
    """Samples in a batch: the leading size of its first tensor (tensors, dicts, sequences)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    values = batch.values() if isinstance(batch, dict) else batch
    if isinstance(values, (list, tuple)) or isinstance(batch, dict):
        for item in values:
            found = batch_size(item)
            if found is not None:
                return found
    return None


class TrainingSpeed(Callback):
    """Logs ``perf/*`` (module docstring) every ``every_n_steps`` steps (None: the trainer's
    ``log_every_n_steps``)."""

    def __init__(self, every_n_steps: int | None = None) -> None:
        self.every_n_steps = every_n_steps
        self._reset()
        self._last_end: float | None = None
        self._batch_start = 0.0

    def _reset(self) -> None:
        self._steps = 0
        self._samples = 0
        self._data = 0.0
        self._total = 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_end = None  # the epoch's first batch waits for new workers: not a step's cost

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_start = time.perf_counter()
        if self._last_end is not None:
            self._data += self._batch_start - self._last_end

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        now = time.perf_counter()
        if self._last_end is not None:  # a full step: from the previous step's end to now
            self._steps += 1
            self._total += now - self._last_end
            self._samples += (batch_size(batch) or 0) * trainer.world_size
        self._last_end = now
        every = self.every_n_steps or trainer.log_every_n_steps or 50
        if self._steps >= every:
            pl_module.log_dict(self._metrics(pl_module), on_step=True, on_epoch=False)
            self._reset()

    def _metrics(self, pl_module: L.LightningModule) -> dict[str, float]:
        out = {
            "perf/samples_per_sec": self._samples / max(self._total, 1e-9),
            "perf/data_time": self._data / self._steps,
            "perf/step_time": self._total / self._steps,
        }
        device = pl_module.device
        if device.type == "cuda" and torch.cuda.is_available():
            out["perf/gpu_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
            torch.cuda.reset_peak_memory_stats(device)
        return out
