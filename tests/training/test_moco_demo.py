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
    from rl_gap.training.cli import run_lightning_cli

    cli = run_lightning_cli(
        ["--config", "recipes/demo/mnist_moco_infonce.yaml", "--model.loss.name=gsap",
         "--wandb=off", f"--output_dir={run_dir}"],
        run=False,
    )  # fmt: skip
    assert type(cli.model.loss_fn).__name__ == "GlobalSmoothAPLoss"
    assert cli.model.loss_scale_value() == 1.0  # "auto": 2τ only for InfoNCE


IN1K = ["in1k_vit_s_infonce", "in1k_vit_s_gsap", "in1k_vit_b_infonce", "in1k_vit_b_gsap"]


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if "vit_b" in n else n for n in IN1K]
)
def test_in1k_recipes_parse_and_build(name, run_dir):
    """Every key of the ImageNet recipes is valid and the module builds (on CPU)."""
    from rl_gap.training.cli import run_lightning_cli

    cli = run_lightning_cli(
        ["--config", f"recipes/moco_v3/{name}.yaml", "--wandb=off", f"--output_dir={run_dir}",
         "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.num_nodes=1",
         "--trainer.strategy=auto", "--trainer.precision=32-true", "--trainer.sync_batchnorm=false",
         "--model.init_args.hidden_dim=256"],  # smaller MLPs: this checks keys, not size
        run=False,
    )  # fmt: skip
    model = cli.model
    vit = model.online.backbone
    assert vit.patch_embed.proj.weight.requires_grad is False
    assert vit.pos_embed.requires_grad is False
    assert model.hparams.lr == pytest.approx(1.5e-4 * 4096 / 256)
    assert model.base_momentum == 0.99
    if name.endswith("infonce"):
        assert model.loss_scale_value() == pytest.approx(0.4)
    else:
        assert type(model.loss_fn).__name__ == "GlobalSmoothAPLoss"
    if "vit_s" in name:
        assert vit.blocks[0].attn.num_heads == 12 and vit.num_features == 384
    # The data module points at the ImageNet layout; nothing is read at construction.
    assert cli.datamodule.batch_size == 4096  # the global batch: 64 GPUs x 64
