"""Throughput on the dashboard: Lightning's ``ThroughputMonitor`` plus what it cannot see.

``rl-gap fit`` adds :func:`throughput_callbacks` whenever a logger is on:

- Lightning's :class:`~lightning.pytorch.callbacks.ThroughputMonitor` logs, over a
  sliding window of ``window_size`` batches, ``train/device/samples_per_sec`` and
  ``train/device/batches_per_sec`` (``train/samples_per_sec`` of all processes under
  DDP), the same for validation (``validate/...``), and
  ``train/device/flops_per_sec`` and ``train/device/mfu`` (model FLOPs utilisation)
  where the FLOPs of a step are known and the device's peak is in Lightning's table
  (NVIDIA data-centre GPUs; none for CPUs).
- :class:`StepFlops` gives the monitor those FLOPs: it counts the first training step
  (forward, backward, optimizer) with torch's ``FlopCounterMode`` (matrix products and
  convolutions, as MFU counts them) and sets ``flops_per_batch`` on the module; the
  batch size is fixed, so every step costs the same.
- :class:`TrainingSpeed` logs what the monitor does not measure: ``perf/data_time``,
  the seconds per step the training loop waited between the end of one step and the
  start of the next (the DataLoader, plus Lightning's own per-step work; the monitor
  times whole steps only, so an input-bound run and a compute-bound one look the same
  there), ``perf/step_time``, and ``perf/gpu_mem_gb``, the peak CUDA memory
  allocated since the last log (the monitor logs no memory).

Times are host wall-clock at batch boundaries; ``TrainingSpeed`` does not synchronise
CUDA (which would slow the run it measures; averaged over many steps the times are
those of the run), the monitor synchronises once per batch.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ThroughputMonitor

__all__ = ["StepFlops", "TrainingSpeed", "batch_size", "throughput_callbacks"]


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


def _samples(batch: Any) -> int:
    return batch_size(batch) or 0


def throughput_callbacks(window_size: int = 20) -> list[Callback]:
    """``[StepFlops(), ThroughputMonitor(...), TrainingSpeed()]``, in this order: the FLOPs
    of the first step are known before the monitor reads them at that step's end.

    ``window_size``: batches the monitor's rates average over (Lightning's default, 100,
    would log no rate in a run shorter than 100 steps per stage)."""
    return [
        StepFlops(),
        ThroughputMonitor(batch_size_fn=_samples, window_size=window_size),
        TrainingSpeed(),
    ]


class StepFlops(Callback):
    """Counts the FLOPs of the first training step and exposes them as the module's
    ``flops_per_batch`` during training (None in evaluation: a validation batch is a
    forward pass of another size, which the monitor would misreport with the training
    step's count). A step whose ops cannot be counted leaves it None (no FLOPs, no MFU)."""

    def __init__(self) -> None:
        self.flops: int | None = None
        self._counter: Any = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        pl_module.flops_per_batch = self.flops

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        pl_module.flops_per_batch = self.flops
        if self.flops is None and self._counter is None:
            from torch.utils.flop_counter import FlopCounterMode

            self._counter = FlopCounterMode(display=False)
            self._counter.__enter__()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        if self._counter is not None:
            counter, self._counter = self._counter, None
            counter.__exit__(None, None, None)
            total = int(counter.get_total_flops())
            self.flops = total if total > 0 else None
        pl_module.flops_per_batch = self.flops

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._counter is not None:  # a step that raised: leave no mode installed
            self._counter.__exit__(None, None, None)
            self._counter = None

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        pl_module.flops_per_batch = None

    on_test_batch_start = on_validation_batch_start
    on_predict_batch_start = on_validation_batch_start


class TrainingSpeed(Callback):
    """Logs ``perf/data_time``, ``perf/step_time`` (seconds per step) and, on CUDA,
    ``perf/gpu_mem_gb`` every ``every_n_steps`` steps (None: the trainer's
    ``log_every_n_steps``), averaged over the steps since its last log."""

    def __init__(self, every_n_steps: int | None = None) -> None:
        self.every_n_steps = every_n_steps
        self._reset()
        self._last_end: float | None = None
        self._batch_start = 0.0

    def _reset(self) -> None:
        self._steps = 0
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
        self._last_end = now
        every = self.every_n_steps or trainer.log_every_n_steps or 50
        if self._steps >= every:
            pl_module.log_dict(self._metrics(pl_module), on_step=True, on_epoch=False)
            self._reset()

    def _metrics(self, pl_module: L.LightningModule) -> dict[str, float]:
        out = {
            "perf/data_time": self._data / self._steps,
            "perf/step_time": self._total / self._steps,
        }
        device = pl_module.device
        if device.type == "cuda" and torch.cuda.is_available():
            out["perf/gpu_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
            torch.cuda.reset_peak_memory_stats(device)
        return out
