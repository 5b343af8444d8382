"""Resuming with ``--ckpt_path last`` after an interrupted run reproduces the uninterrupted run (CPU)."""

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from rl_gap.training.cli import run_lightning_cli

RECIPE = "recipes/demo/mnist_gsap.yaml"


class InterruptAt(Callback):
    """Simulates a crash: raises at a given (epoch, batch) of training."""

    def __init__(self, epoch: int, batch: int) -> None:
        self.epoch, self.batch = epoch, batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            raise RuntimeError("simulated interruption")


class CountSteps(Callback):
    def __init__(self) -> None:
        self.steps = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.steps += 1


def _argv(run_dir, name, epochs, batches):
    return [
        "--config", RECIPE, "--output_dir", str(run_dir), "--run_name", name, "--wandb", "off",
        "--trainer.max_epochs", str(epochs), "--trainer.limit_train_batches", str(batches),
        "--trainer.limit_val_batches", "1", "--trainer.check_val_every_n_epoch", "1",
        "--trainer.enable_progress_bar", "false", "--data.init_args.eval_batch_size", "100",
        "--model.init_args.eval_plots", "false", "--model.init_args.backbone_kwargs",
        "{width: 8}", "--model.init_args.loss.name", "infonce",
    ]  # fmt: skip


def _weights(cli):
    return {k: v.clone() for k, v in cli.model.state_dict().items()}


@pytest.mark.parametrize(
    "epochs, batches", [(2, 2), pytest.param(3, 4, marks=pytest.mark.slow)], ids=["fast", "long"]
)
def test_resume_after_interruption_matches_uninterrupted(run_dir, epochs, batches):
    full = run_lightning_cli(["fit", *_argv(run_dir, "full", epochs, batches)])
    expected_metrics = {k: float(v) for k, v in full.trainer.callback_metrics.items()}
    expected_weights = _weights(full)

    # crash in the middle of the last epoch: last.ckpt holds the end of the one before
    crashed = run_lightning_cli(_argv(run_dir, "resumed", epochs, batches), run=False)
    crashed.trainer.callbacks.append(InterruptAt(epoch=epochs - 1, batch=1))
    with pytest.raises(RuntimeError, match="simulated interruption"):
        crashed.trainer.fit(crashed.model, crashed.datamodule)
    assert (run_dir / "resumed" / "checkpoints" / "last.ckpt").is_file()

    # what `rl-gap fit ... --ckpt_path last` runs, with a counter of the steps actually trained
    resumed = run_lightning_cli(_argv(run_dir, "resumed", epochs, batches), run=False)
    counter = CountSteps()
    resumed.trainer.callbacks.append(counter)
    resumed.trainer.fit(resumed.model, resumed.datamodule, ckpt_path="last")
    assert counter.steps == batches, "resume must continue from the last epoch, not restart"
    assert resumed.trainer.current_epoch == epochs
    assert resumed.trainer.global_step == epochs * batches
    got = {k: float(v) for k, v in resumed.trainer.callback_metrics.items()}
    for key in ("val/gap", "val/map", "val/r@1", "val/protocol_f1g"):
        assert got[key] == pytest.approx(expected_metrics[key], abs=1e-6), key
    for name, value in _weights(resumed).items():
        torch.testing.assert_close(value, expected_weights[name], rtol=0, atol=1e-6, msg=name)


def _checkpoint_with_optimizer_state(path, value):
    torch.save(
        {
            "state_dict": {"w": torch.ones(3)},
            "optimizer_states": [{"state": {0: {"exp_avg_sq": torch.tensor([1.0, value])}}}],
            "loops": {},
            "epoch": 0,
            "global_step": 1,
            "pytorch-lightning_version": "2.0.0",
        },
        path,
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_resume_refuses_a_non_finite_optimizer_state(tmp_path, bad):
    from rl_gap.training.resume import ResumeRefused, check_resume

    path = tmp_path / "diverged.ckpt"
    _checkpoint_with_optimizer_state(path, bad)
    with pytest.raises(ResumeRefused, match=r"NaN/inf optimizer state .*exp_avg_sq"):
        check_resume("fit", str(path), tmp_path, {}, force=True)
    _checkpoint_with_optimizer_state(path, 2.0)  # the same checkpoint, finite: accepted
    assert check_resume("fit", str(path), tmp_path, {}, force=True).path == path
