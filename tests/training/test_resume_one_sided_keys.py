"""The resume check: a training key present on one side only is a difference."""

import pytest
import torch

from rl_gap.training.cli import run_lightning_cli
from rl_gap.training.run_config import config_mismatch


@pytest.mark.parametrize(
    "saved, current",
    [
        ({"lr": 0.1}, {"lr": 0.1, "model.neg_drop": 0.5}),
        ({"lr": 0.1, "model.neg_drop": 0.5}, {"lr": 0.1}),
        ({}, {"model.neg_drop": None}),  # present with a None value still differs from absent
    ],
)
def test_a_key_on_one_side_only_is_a_mismatch(saved, current):
    diff = config_mismatch(saved, current)
    assert diff is not None
    (key,) = set(saved) ^ set(current)
    assert diff.strip().startswith(f"{key}:")
    assert config_mismatch(current, saved) is not None


RECIPE = "recipes/demo/mnist_gsap.yaml"


def _argv(run_dir, *extra):
    return [
        "--config", RECIPE, "--output_dir", str(run_dir), "--run_name", "one_sided",
        "--wandb", "off", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
        "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
        "--data.init_args.eval_batch_size", "100", "--model.init_args.eval_plots", "false",
        "--model.init_args.backbone_kwargs", "{width: 8}", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("side", ["checkpoint_lacks_a_key", "checkpoint_has_an_extra_key"])
def test_resume_refuses_a_checkpoint_whose_config_differs_by_a_one_sided_key(run_dir, capsys, side):
    first = run_lightning_cli(["fit", *_argv(run_dir)])
    assert first.trainer.global_step == 2
    path = run_dir / "one_sided" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    config = ckpt["rl_gap"]["config"]
    if side == "checkpoint_lacks_a_key":
        key = "model.init_args.lr"
        assert key in config
        del config[key]
    else:
        key = "model.init_args.an_option_this_version_lacks"
        assert key not in config
        config[key] = 0.5
    torch.save(ckpt, path)
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", *_argv(run_dir, "--ckpt_path", "last")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "refusing to resume" in err and f"{key}:" in err
