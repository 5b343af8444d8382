"""Optimizer/schedule settings: one OptimizerSettings, checked when made (errors name the
setting), building the optimizer and schedule a module trains with."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rl_gap.modules import MetricLearningModule
from rl_gap.modules.moco_v3 import MoCoV3Module
from rl_gap.optim import (
    OptimizerSettings,
    OptimizerSettingsError,
    build_optimizer,
    check_optimizer_settings,
    param_groups,
)

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
TINY = dict(backbone="rl_gap_convnet", backbone_kwargs={"width": 4}, in_chans=1, dim=8)
GOOD = dict(
    optimizer="adamw",
    lr=1e-3,
    weight_decay=0.05,
    betas=(0.9, 0.999),
    momentum=0.9,
    scheduler="cosine",
    warmup=0.1,
    min_lr_ratio=0.0,
    lr_scales={"encoder.backbone.": 0.1},
)

BAD = [
    ("lr", math.nan, "lr must be a finite number"),
    ("lr", math.inf, "lr must be a finite number"),
    ("lr", 0.0, "lr must be a finite number > 0"),
    ("lr", -1e-3, "lr must be a finite number > 0"),
    ("lr", "fast", "lr must be a number"),
    ("weight_decay", math.nan, "weight_decay must be a finite number"),
    ("weight_decay", -0.1, "weight_decay must be a finite number >= 0"),
    ("betas", (0.9, 1.0), r"betas must lie in \[0, 1\)"),
    ("betas", (0.9, math.nan), r"betas\[1\] must be a finite number"),
    ("betas", (0.9,), "betas must be two numbers"),
    ("momentum", 1.5, r"momentum \(SGD/LARS\) must lie in \[0, 1\)"),
    ("momentum", math.nan, "momentum must be a finite number"),
    ("optimizer", "adamm", "unknown optimizer 'adamm'; known: adamw, lars, sgd"),
    ("scheduler", "cosin", "unknown scheduler 'cosin'"),
    ("warmup", -1, "warmup is a fraction"),
    ("warmup", 2.5, "warmup is a fraction"),
    ("warmup", math.nan, "warmup must be a finite number"),
    ("min_lr_ratio", 1.5, r"min_lr_ratio must lie in \[0, 1\]"),
    ("lr_scales", {"encoder.": math.nan}, r"lr_scales\['encoder.'\] must be a finite number"),
    ("lr_scales", {"encoder.": -1.0}, r"lr_scales\['encoder.'\] must be a finite number >= 0"),
]


def test_good_settings_pass_and_build_an_optimizer():
    check_optimizer_settings(**GOOD)
    check_optimizer_settings(**{**GOOD, "optimizer": "LARS", "warmup": 500.0, "lr_scales": None})
    model = torch.nn.Linear(3, 2)
    opt = build_optimizer("adamw", param_groups([model], 0.05), lr=1e-3, weight_decay=0.05)
    assert {g["lr"] for g in opt.param_groups} == {1e-3}


@pytest.mark.parametrize(("key", "value", "message"), BAD, ids=lambda v: str(v)[:20])
def test_bad_setting_is_named(key, value, message):
    with pytest.raises(OptimizerSettingsError, match=message) as info:
        OptimizerSettings(**{**GOOD, key: value})
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=message):
        check_optimizer_settings(**{**GOOD, key: value})


def test_defaults_and_frozen():
    settings = OptimizerSettings()
    assert (settings.optimizer, settings.lr, settings.weight_decay) == ("adamw", 1e-4, 1e-4)
    assert (settings.betas, settings.momentum, settings.scheduler) == ((0.9, 0.999), 0.9, "cosine")
    assert (settings.warmup, settings.min_lr_ratio, settings.lr_scales) == (0.0, 0.0, None)
    with pytest.raises(AttributeError):
        settings.lr = 1.0  # one object, checked once: never changed after the check
    assert OptimizerSettings(betas=[0.9, 0.98]).betas == (0.9, 0.98)


def test_settings_build_the_optimizer_and_schedule_they_describe():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    settings = OptimizerSettings(
        optimizer="sgd", lr=0.1, weight_decay=0.01, momentum=0.8, lr_scales={"1.": 0.5},
        warmup=2, min_lr_ratio=0.0,
    )  # fmt: skip
    optimizer = settings.optimizer_for([model])
    assert type(optimizer) is torch.optim.SGD
    groups = {(g["weight_decay"], g["lr"]) for g in optimizer.param_groups}
    # layer 0 at lr 0.1, layer 1 at 0.1 x 0.5; weights decay, biases do not
    assert groups == {(0.01, 0.1), (0.0, 0.1), (0.01, 0.05), (0.0, 0.05)}
    assert {g["momentum"] for g in optimizer.param_groups} == {0.8}
    scheduler = settings.scheduler_for(optimizer, total_steps=6)
    lrs = []
    for _ in range(6):
        lrs.append(max(g["lr"] for g in optimizer.param_groups))
        optimizer.step()
        scheduler.step()
    # warmup (k+1)/2 for k < 2, then 0.5 (1 + cos(pi (k-2)/4)) by hand
    expected = [0.05, 0.1, 0.1, 0.1 * (1 + math.cos(math.pi / 4)) / 2, 0.05,
                0.1 * (1 + math.cos(3 * math.pi / 4)) / 2]  # fmt: skip
    assert lrs == pytest.approx(expected)
    assert OptimizerSettings(scheduler="none").scheduler_for(optimizer, 6) is None


@pytest.mark.parametrize(("key", "value", "message"), [BAD[0], BAD[6], BAD[12]])
def test_metric_learning_module_rejects_at_construction(key, value, message):
    with pytest.raises(ValueError, match=message):
        MetricLearningModule(**TINY, **{key: value})


def test_moco_rejects_nan_lr_and_bad_momentum_sgd():
    kwargs = dict(
        backbone="vit_tiny_patch16_224",
        backbone_kwargs=dict(img_size=8, patch_size=4, in_chans=1, depth=1, embed_dim=16),
        hidden_dim=32,
        embed_dim=8,
        retrieval_max_queries=0,
    )
    with pytest.raises(ValueError, match="lr must be a finite number"):
        MoCoV3Module(**kwargs, lr=math.nan)
    with pytest.raises(ValueError, match="momentum"):
        MoCoV3Module(**kwargs, optimizer="lars", momentum_sgd=1.0)


@pytest.mark.parametrize("value", [".nan", ".inf", "-0.001"])
def test_fit_cli_rejects_a_bad_lr_before_training(run_dir, value, capsys):
    """`rl-gap fit ... --model.init_args.lr .nan` used to train to chance and exit 0; it is
    refused while parsing, with one line naming the key."""
    from rl_gap.training.cli import run_lightning_cli

    argv = ["--config", str(RECIPES / "demo" / "mnist_gsap.yaml"), "--model.init_args.lr", value]
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(argv + ["--wandb", "off", "--output_dir", str(run_dir)], run=False)
    assert exit_info.value.code == 2
    assert "--model.init_args: lr must be a finite number" in capsys.readouterr().err
    assert not run_dir.exists()  # nothing written before the refusal


def test_linear_probe_rejects_nan_lr_before_loading_anything(tmp_path):
    from rl_gap.cli import main
    from rl_gap.commands.linear_probe import train_linear_probe

    missing = str(tmp_path / "no.ckpt")  # never opened: the settings are checked first
    with pytest.raises(ValueError, match="lr must be a finite number"):
        main(["linear-probe", "--checkpoint", missing, "--data", "mnist5k", "--lr", "nan"])
    with pytest.raises(ValueError, match="weight_decay must be a finite number >= 0"):
        main(["linear-probe", "--checkpoint", missing, "--weight-decay", "-1"])
    x, y = torch.randn(8, 3), torch.arange(8) % 2
    with pytest.raises(ValueError, match="lr must be a finite number"):
        train_linear_probe(x, y, x, y, epochs=1, lr=math.inf)
    with pytest.raises(ValueError, match=r"momentum \(SGD/LARS\) must lie in \[0, 1\)"):
        train_linear_probe(x, y, x, y, epochs=1, momentum=1.0)
