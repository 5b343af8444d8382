"""Callbacks the fault-tolerance tests load into ``rl-gap fit`` (``--trainer.callbacks+=...``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class SigtermAtStep(Callback):
    """Sends this process a real SIGTERM right after optimizer step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class PauseAtStep(Callback):
    """After step ``step``: writes ``marker`` and waits (up to ``timeout`` s) for a SIGTERM.

    Lets a test deliver SIGTERM from *another* process at a known point of the run.
    """

    def __init__(self, step: int, marker: str, timeout: float = 120.0) -> None:
        self.step, self.marker, self.timeout = step, Path(marker), timeout

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step != self.step:
            return
        self.marker.write_text(f"{trainer.current_epoch} {batch_idx}\n")
        deadline = time.monotonic() + self.timeout
        while not _sigterm_noted(trainer) and time.monotonic() < deadline:
            time.sleep(0.05)


def _sigterm_noted(trainer) -> bool:
    """Whether this process's SIGTERM handler (FaultTolerance's flag) has run."""
    return trainer.received_sigterm or any(
        getattr(cb, "sigterm_pending", False) for cb in trainer.callbacks
    )


class PauseUntil(Callback):
    """After step ``step``: writes ``<marker>.rank<R>`` and waits (up to ``timeout`` s) for ``go``.

    Lets a test signal one process of a multi-process run at a known step, then let all go on.
    """

    def __init__(self, step: int, marker: str, go: str, timeout: float = 120.0) -> None:
        self.step, self.marker, self.go, self.timeout = step, marker, Path(go), timeout

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step != self.step:
            return
        Path(f"{self.marker}.rank{trainer.global_rank}").write_text(f"{os.getpid()}\n")
        deadline = time.monotonic() + self.timeout
        while not self.go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)


class RecordBatches(Callback):
    """Appends ``epoch step first-index-hash`` of every training batch to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        images = batch[0] if isinstance(batch, (list, tuple)) else batch
        with self.path.open("a") as f:
            f.write(f"{trainer.current_epoch} {trainer.global_step} {float(images.sum()):.6f}\n")


class SigtermAtSetup(Callback):
    """Sends this process a real SIGTERM while the fit sets up (before Lightning's handler)."""

    def setup(self, trainer, pl_module, stage):
        os.kill(os.getpid(), signal.SIGTERM)


class SigtermAtFitEnd(Callback):
    """Sends this process a real SIGTERM once the fit has ended (after Lightning's teardown)."""

    def on_fit_end(self, trainer, pl_module):
        os.kill(os.getpid(), signal.SIGTERM)


class SigintAtStep(Callback):
    """Sends this process a real SIGINT (Ctrl-C) right after optimizer step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)
