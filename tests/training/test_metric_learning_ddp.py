"""One training epoch with 2 CPU processes (DDP, gloo): global m-per-class batches, gathered loss."""

import re
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from rl_gap import dist
from rl_gap.training.cli import run_lightning_cli


class CheckGlobalBatch(Callback):
    """Fails the run unless the ranks' batches form one global batch with 20 images per digit."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        assert trainer.world_size == 2
        images, labels, indices = batch
        assert len(labels) == 50  # global batch 100 split over 2 ranks
        all_labels, all_indices = dist.gather_no_grad(labels), dist.gather_no_grad(indices)
        assert torch.bincount(all_labels, minlength=5).tolist() == [20] * 5
        assert len(torch.unique(all_indices)) == 100  # ranks draw distinct samples


@pytest.mark.ddp
def test_two_process_ddp_epoch(run_dir, capsys):
    argv = [
        "fit", "--config", "recipes/demo/mnist_gsap.yaml", "--output_dir", str(run_dir),
        "--wandb", "off", "--trainer.devices", "2", "--trainer.strategy", "ddp_spawn",
        "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3",
        "--trainer.limit_val_batches", "1", "--trainer.check_val_every_n_epoch", "1",
        "--trainer.enable_progress_bar", "false", "--data.init_args.eval_batch_size", "60",
        "--model.init_args.eval_plots", "false", "--model.init_args.backbone_kwargs", "{width: 8}",
        f"--trainer.callbacks+={__name__}.CheckGlobalBatch",
    ]  # fmt: skip
    cli = run_lightning_cli(argv)
    assert cli.trainer.state.finished
    metrics = cli.trainer.callback_metrics
    assert 0.0 < float(metrics["val/gap"]) <= 1.0
    # both ranks' 60 validation images were gathered: 120 leave-one-out queries
    assert float(metrics["val/num_queries"]) == 120
    last = torch.load(
        Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt", weights_only=False
    )
    assert last["global_step"] == 3
    # the launcher's summary names the metrics file the rank-0 worker wrote (not version_1)
    summary = re.search(r"metrics \(CSV\)\s+(\S+)", capsys.readouterr().out)
    assert summary and Path(summary.group(1)).is_file(), summary
