"""Resuming with ``--ckpt_path last`` after an interrupted run reproduces the uninterrupted run (CPU)."""

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from rl_gap.training_cli import run_lightning_cli

RECIPE = "recipes/demo/mnist_gsap.yaml"


class InterruptAt(Callback):
    """Simulates a crash: raises at a given (epoch, batch) of training."""

    def __init__(self, epoch: int, batch: int) -> None:
        self.epoch, self.batch = epoch, batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            raise RuntimeError("simulated interruption")


def _argv(run_dir, name):
    return [
        "--config", RECIPE, "--output_dir", str(run_dir), "--run_name", name, "--wandb", "off",
        "--trainer.max_epochs", "3", "--trainer.limit_train_batches", "3",
        "--trainer.limit_val_batches", "1", "--trainer.check_val_every_n_epoch", "1",
        "--trainer.enable_progress_bar", "false", "--data.init_args.eval_batch_size", "100",
        "--model.init_args.eval_plots", "false", "--model.init_args.backbone_kwargs",
        "{width: 8}", "--model.init_args.loss.name", "infonce",
    ]  # fmt: skip


def _weights(cli):
    return {k: v.clone() for k, v in cli.model.state_dict().items()}


@pytest.mark.slow
def test_resume_after_interruption_matches_uninterrupted(run_dir):
    full = run_lightning_cli(["fit", *_argv(run_dir, "full")])
    expected_metrics = {k: float(v) for k, v in full.trainer.callback_metrics.items()}
    expected_weights = _weights(full)

    # crash in the middle of the third epoch: last.ckpt holds the end of the second
    crashed = run_lightning_cli(_argv(run_dir, "resumed"), run=False)
    crashed.trainer.callbacks.append(InterruptAt(epoch=2, batch=1))
    with pytest.raises(RuntimeError, match="simulated interruption"):
        crashed.trainer.fit(crashed.model, crashed.datamodule)
    assert (run_dir / "resumed" / "checkpoints" / "last.ckpt").is_file()

    resumed = run_lightning_cli(["fit", *_argv(run_dir, "resumed"), "--ckpt_path", "last"])
    assert resumed.trainer.current_epoch == 3 and resumed.trainer.global_step == 9
    got = {k: float(v) for k, v in resumed.trainer.callback_metrics.items()}
    for key in ("val/gap", "val/map", "val/r@1", "val/protocol_f1g"):
        assert got[key] == pytest.approx(expected_metrics[key], abs=1e-6), key
    for name, value in _weights(resumed).items():
        torch.testing.assert_close(value, expected_weights[name], rtol=0, atol=1e-6, msg=name)
