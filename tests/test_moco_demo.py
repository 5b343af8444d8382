"""``fast_dev_run`` of the MoCo v3 demo recipes through the real ``rl-gap fit`` CLI."""

from __future__ import annotations

import pytest

from rl_gap.cli import main


@pytest.mark.parametrize("loss", ["infonce", "gsap"])
def test_demo_recipe_fast_dev_run(loss, run_dir):
    argv = [
        "fit",
        "--config",
        f"recipes/demo/mnist_moco_{loss}.yaml",
        "--trainer.fast_dev_run=true",
        "--trainer.enable_progress_bar=false",
        "--wandb=off",
        f"--output_dir={run_dir}",
        # One small batch keeps the test fast; the recipe's own sizes run in `make demo`-like use.
        "--data.init_args.batch_size=32",
        "--data.init_args.eval_batch_size=64",
    ]
    assert main(argv) == 0


def test_recipe_loss_swap_is_one_flag(run_dir):
    from rl_gap.training_cli import run_lightning_cli

    cli = run_lightning_cli(
        ["--config", "recipes/demo/mnist_moco_infonce.yaml", "--model.loss.name=gsap",
         "--wandb=off", f"--output_dir={run_dir}"],
        run=False,
    )  # fmt: skip
    assert type(cli.model.loss_fn).__name__ == "GlobalSmoothAPLoss"
    assert cli.model.loss_scale_value() == 1.0  # "auto": 2τ only for InfoNCE
