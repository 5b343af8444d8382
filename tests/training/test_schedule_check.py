"""A fit whose schedule never validates warns at start-up, naming the keys."""

import pytest
from cluster_helpers import fit_argv

from rl_gap.training.cli import run_lightning_cli
from rl_gap.training.schedule_check import schedule_problems


def _problems(max_epochs=4, every=4, **kw):
    args = dict(max_epochs=max_epochs, max_steps=-1, every_n_epochs=every,
                val_check_interval=None, limit_val_batches=1.0, batches_per_epoch=10,
                has_val_data=True)  # fmt: skip
    return schedule_problems(**{**args, **kw})


def test_never_validates_names_the_keys_and_monitors():
    (msg,) = _problems(max_epochs=1, monitors=["val/gap"])
    assert "trainer.max_epochs=1 with trainer.check_val_every_n_epoch=4" in msg
    assert "never validates" in msg and "val/gap" in msg and "at most 1" in msg
    (msg,) = _problems(max_epochs=4, max_steps=15)  # 15 steps of 10: 2 epochs
    assert "trainer.max_steps=15" in msg and "never validates" in msg
    (msg,) = _problems(limit_val_batches=0)
    assert "trainer.limit_val_batches=0" in msg


def test_last_epochs_unvalidated():
    (msg,) = _problems(max_epochs=6)
    assert "last validation is at epoch 4 of 6" in msg


@pytest.mark.parametrize(
    "kw",
    [
        dict(max_epochs=4), dict(max_epochs=8), dict(max_epochs=1, every=1),
        dict(max_epochs=-1), dict(max_epochs=1, has_val_data=False),
        dict(max_epochs=1, every=None, val_check_interval=100),  # validates by steps
    ],
)  # fmt: skip
def test_schedules_that_validate_at_the_end(kw):
    assert _problems(**kw) == []


def test_fit_warns_before_training(run_dir):
    argv = fit_argv(run_dir, "never", epochs=1, batches=1)
    argv += ["--trainer.check_val_every_n_epoch", "4"]  # the demo recipe's own schedule
    with pytest.warns(UserWarning, match=r"check_val_every_n_epoch=4: this fit never validates"):
        cli = run_lightning_cli(["fit", *argv])
    assert not any(k.startswith("val/") for k in cli.trainer.callback_metrics)
