"""The trainer parts ``rl-gap fit`` adds: callbacks, atomic checkpoints, the batch/ranks check."""

from __future__ import annotations

from types import SimpleNamespace

from lightning.pytorch.callbacks import (
    LearningRateMonitor,
    ModelCheckpoint,
    RichProgressBar,
    ThroughputMonitor,
)

from rl_gap.callbacks.speed import StepFlops, TrainingSpeed
from rl_gap.training.checkpoint_io import AtomicCheckpointIO
from rl_gap.training.schedule_check import ValidationScheduleCheck
from rl_gap.training.trainer_setup import (
    batch_ranks_error,
    default_callbacks,
    with_atomic_checkpoint_io,
)


def test_global_batch_must_divide_the_ranks():
    trainer = SimpleNamespace(num_devices=4, num_nodes=2)
    data = SimpleNamespace(batch_size=36, batch_is_global=True)
    assert batch_ranks_error(trainer, data) == (
        "data.batch_size 36 is the global batch and must be divisible by the 8 ranks "
        "(devices x nodes); use a multiple of 8"
    )
    assert batch_ranks_error(trainer, SimpleNamespace(batch_size=32, batch_is_global=True)) is None
    assert batch_ranks_error(trainer, SimpleNamespace(batch_size=36)) is None  # per-rank batch


def test_atomic_checkpoint_io_is_added_once():
    plugins = with_atomic_checkpoint_io(None)
    assert [type(p) for p in plugins] == [AtomicCheckpointIO]
    assert with_atomic_checkpoint_io(plugins) == plugins


def test_default_callbacks_fill_what_the_recipe_left_out(tmp_path):
    added = default_callbacks({"logger": True}, tmp_path)
    kinds = [type(c) for c in added]
    assert kinds == [
        RichProgressBar, LearningRateMonitor, ModelCheckpoint, StepFlops, ThroughputMonitor,
        TrainingSpeed, ValidationScheduleCheck,
    ]  # fmt: skip
    (checkpoint,) = [c for c in added if isinstance(c, ModelCheckpoint)]
    assert checkpoint.dirpath == str(tmp_path / "checkpoints") and checkpoint.save_last
    own = ModelCheckpoint(save_last=False)
    quiet = {"callbacks": [own], "enable_progress_bar": False, "logger": False}
    kept = default_callbacks(quiet, tmp_path)
    assert kept[0] is own and [type(c) for c in kept[1:]] == [ValidationScheduleCheck]
    assert own.dirpath == str(tmp_path / "checkpoints")  # one folder per run
