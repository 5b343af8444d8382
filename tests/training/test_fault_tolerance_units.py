"""Unit tests of the fault-tolerance pieces, without a training run.

- ``FaultTolerance``: the exit status of a stop (143 SIGTERM, 130 Ctrl-C), ``last.ckpt``
  written once per step whatever calls it, every N steps only;
- ``FreshFitGuard``: a fresh fit into a folder holding a single checkpoint is refused;
- ``ResumableBatchLoader``: a position saved exactly at the end of an epoch resumes with
  the next epoch's batches (the uninterrupted run's), not a repeat or a skipped epoch.
"""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import TensorDataset

from rl_gap.data.resumable import SeededItems, ShuffledBatchSampler
from rl_gap.data.sampler import ResumableBatchLoader
from rl_gap.training.fault_tolerance import SIGTERM_EXIT_CODE, FaultTolerance
from rl_gap.training.run_folder import FreshFitGuard


class _Trainer:
    """What FaultTolerance uses of a Trainer: one process, a counting save_checkpoint."""

    def __init__(self, step: int = 0) -> None:
        self.global_step, self.current_epoch = step, 0
        self.saved: list[tuple[int, str]] = []
        self.is_global_zero = True
        self.checkpoint_callbacks: list = []
        self.strategy = SimpleNamespace(
            reduce_boolean_decision=lambda flag, all=True: bool(flag), checkpoint_io=None
        )
        self._signal_connector = SimpleNamespace(received_sigterm=False)
        self.state = SimpleNamespace(fn="fit")

    def save_checkpoint(self, path) -> None:
        self.saved.append((self.global_step, Path(path).name))
        Path(path).write_bytes(b"ckpt")


def test_exit_codes_of_a_stop():
    ft = FaultTolerance("unused")
    assert ft.exit_code == SIGTERM_EXIT_CODE == 143
    ft.stop_signum = signal.SIGINT
    assert ft.exit_code == 130


def test_step_checkpoint_every_n_steps_written_once_per_step(tmp_path):
    ft = FaultTolerance(tmp_path, every_n_steps=2)
    trainer = _Trainer()
    for step in (1, 2, 2, 3, 4):  # step 2 twice: e.g. a second loader's batch end
        trainer.global_step = step
        ft.on_train_batch_end(trainer, None, None, None, 0)
    assert [s for s, _ in trainer.saved] == [2, 4]
    assert {name for _, name in trainer.saved} == {"last.ckpt.tmp"}  # then renamed
    assert (tmp_path / "last.ckpt").read_bytes() == b"ckpt"


def test_sigterm_saves_once_and_stops_with_143(tmp_path, capsys):
    ft = FaultTolerance(tmp_path, every_n_steps=5)
    trainer = _Trainer(step=5)
    ft._note_sigterm(signal.SIGTERM, None)
    with pytest.raises(SIGTERMException) as info:
        ft.on_train_batch_end(trainer, None, None, None, 0)
    assert info.value.code == 143
    ft.on_exception(trainer, None, info.value)  # Lightning's teardown: no second save
    assert [s for s, _ in trainer.saved] == [5]
    assert ft.sigterm_checkpoint == tmp_path / "last.ckpt"
    assert "SIGTERM at epoch 0, step 5: saved" in capsys.readouterr().err
    from rl_gap.training.stop_request import clear_stop_request

    clear_stop_request()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_fresh_fit_into_a_folder_with_one_checkpoint_is_refused(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "epoch=0-step=1.ckpt").write_bytes(b"x")
    guard = FreshFitGuard(tmp_path / "checkpoints")
    with pytest.raises(FileExistsError, match=r"holds checkpoints of an earlier run \(epoch=0"):
        guard.on_fit_start(SimpleNamespace(ckpt_path=None), None)
    guard.on_fit_start(SimpleNamespace(ckpt_path="x.ckpt"), None)  # a resume goes on


def _loader():
    data = TensorDataset(torch.arange(12.0))
    return ResumableBatchLoader(
        SeededItems(data), batch_sampler=ShuffledBatchSampler(12, 4, seed=3)
    )


def _epoch(loader, epoch):
    loader.batch_sampler.set_epoch(epoch)
    return [batch[0].tolist() for batch in loader]


def test_loader_resumed_from_the_end_of_an_epoch_serves_the_next_epoch():
    full = _loader()
    epochs = [_epoch(full, 0), _epoch(full, 1)]
    assert epochs[0] != epochs[1] and len(epochs[0]) == 3
    cut = _loader()
    _epoch(cut, 0)
    state = cut.state_dict()
    assert state == {"epoch": 0, "batches_done": 3}  # saved exactly at the epoch's end
    resumed = _loader()
    resumed.load_state_dict(state)
    # what Lightning does next: the finished epoch is over (nothing served twice) ...
    assert [b[0].tolist() for b in resumed] == []
    # ... and the next one is the uninterrupted run's epoch 1
    assert _epoch(resumed, 1) == epochs[1]
