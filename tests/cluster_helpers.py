"""Shared pieces of the cluster-fault tests: a tiny ``rl-gap fit`` command line and weight checks."""

from __future__ import annotations

from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "demo" / "mnist_gsap.yaml"


def fit_argv(out, name, *extra, epochs=2, batches=2):
    """``rl-gap fit`` arguments for a tiny demo run (width-8 CNN, ``batches`` steps per epoch)."""
    argv = [
        "--config", str(RECIPE), "--output_dir", str(out), "--wandb", "off",
        "--trainer.max_epochs", str(epochs), "--trainer.limit_train_batches", str(batches),
        "--trainer.limit_val_batches", "1", "--trainer.check_val_every_n_epoch", str(epochs),
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--data.init_args.eval_batch_size", "100", "--model.init_args.eval_plots", "false",
        "--model.init_args.backbone_kwargs", "{width: 8}", *extra,
    ]  # fmt: skip
    return [*argv, "--run_name", name] if name else argv


def weights(cli_or_ckpt):
    """The model's weights, from a CLI object or a checkpoint dict (``state_dict``)."""
    if isinstance(cli_or_ckpt, dict):
        return {k: v.clone() for k, v in cli_or_ckpt["state_dict"].items()}
    return {k: v.detach().clone() for k, v in cli_or_ckpt.model.state_dict().items()}


def assert_same_weights(got, expected):
    assert got.keys() == expected.keys()
    for name, value in got.items():  # exact: resuming must not change a single bit
        torch.testing.assert_close(value, expected[name], rtol=0, atol=0, msg=name)


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)
