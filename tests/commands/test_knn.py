"""``rl-gap knn`` from a checkpoint: loads the weights, splits, and scores like the metric."""

from __future__ import annotations

import json
from pathlib import Path

import lightning
import pytest
import torch

from rl_gap.cli import main
from rl_gap.commands.knn import extract_features, recipe_module_class
from rl_gap.data.ssl_mnist import MNIST5kSSLDataModule
from rl_gap.metrics.knn import weighted_knn_accuracy
from rl_gap.modules.moco_v3 import MoCoV3Module

TINY = dict(
    backbone="vit_tiny_patch16_224",
    backbone_kwargs=dict(img_size=28, patch_size=7, in_chans=1, depth=1, embed_dim=16, num_heads=2),
    hidden_dim=32,
    embed_dim=8,
)


def tiny_checkpoint(tmp_path, seed: int = 0):
    """A MoCoV3Module checkpoint as Lightning writes it (state dict + hyper-parameters)."""
    torch.manual_seed(seed)
    module = MoCoV3Module(**TINY)
    path = tmp_path / "tiny.ckpt"
    torch.save(
        {
            "state_dict": module.state_dict(),
            "hyper_parameters": dict(module.hparams),
            "pytorch-lightning_version": lightning.__version__,
        },
        path,
    )
    return path, module


def test_knn_command_matches_metric_on_original_weights(tmp_path):
    path, original = tiny_checkpoint(tmp_path, seed=3)
    out = tmp_path / "knn.json"
    argv = ["knn", "--checkpoint", str(path), "--data", "mnist5k", "--device", "cpu",
            "--k", "10", "20", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["num_bank"] == 4000 and result["num_queries"] == 1000

    dm = MNIST5kSSLDataModule()
    dm.setup("validate")
    original.eval()
    bank, bank_labels = extract_features(original, dm.bank_set)
    queries, query_labels = extract_features(original, dm.query_set)
    for k in (10, 20):
        expected = weighted_knn_accuracy(queries, query_labels, bank, bank_labels, k=k)
        assert result[f"k{k}/top1"] == pytest.approx(expected["top1"], abs=1e-12)
        assert result[f"k{k}/top5"] == pytest.approx(expected["top5"], abs=1e-12)
    assert result["k20/top1"] > 0.3  # random ViT features of digits: far above chance


def test_knn_command_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        main(["knn", "--checkpoint", str(tmp_path / "none.ckpt"), "--data", "mnist5k"])
    path, _ = tiny_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="--train-dir"):
        main(["knn", "--checkpoint", str(path), "--data", "imagefolder", "--device", "cpu"])


def test_knn_command_refuses_k_beyond_the_bank(tmp_path):
    path, _ = tiny_checkpoint(tmp_path)
    base = ["knn", "--checkpoint", str(path), "--data", "mnist5k", "--device", "cpu"]
    # mnist5k: 4000 training images form the bank; k = 4001 would be reported as k4001
    # while the classifier used 4000 neighbours
    with pytest.raises(ValueError, match=r"--k \[4001\] exceeds the bank \(4000"):
        main([*base, "--k", "20", "4001"])
    with pytest.raises(ValueError, match="--k entry must be >= 1"):
        main([*base, "--k", "0"])
    with pytest.raises(ValueError, match="duplicate"):
        main([*base, "--k", "20", "20"])


ROOT = Path(__file__).resolve().parents[2]
MOCO_RECIPE = ROOT / "recipes" / "demo" / "mnist_moco_gsap.yaml"


def test_knn_takes_the_datasets_of_a_recipes_datamodule(tmp_path):
    """``--config``: the recipe's MNIST5kSSLDataModule with its values, ``--data-arg`` on top."""
    path, original = tiny_checkpoint(tmp_path, seed=5)
    out = tmp_path / "knn.json"
    argv = ["knn", "--checkpoint", str(path), "--config", str(MOCO_RECIPE), "--device", "cpu",
            "--data-arg", "num_train=1000", "--data-arg", "seed=3", "--k", "7",
            "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["num_bank"] == 1000 and result["num_queries"] == 4000
    # the recipe's data section, written out by hand, with the two overrides
    dm = MNIST5kSSLDataModule(num_train=1000, crop_min=0.3, batch_size=256, eval_batch_size=500,
                              seed=3)  # fmt: skip
    dm.setup("validate")
    original.eval()
    bank, bank_labels = extract_features(original, dm.bank_set)
    queries, query_labels = extract_features(original, dm.query_set)
    expected = weighted_knn_accuracy(queries, query_labels, bank, bank_labels, k=7)
    assert result["k7/top1"] == pytest.approx(expected["top1"], abs=1e-12)
    assert recipe_module_class(MOCO_RECIPE) == "rl_gap.modules.moco_v3.MoCoV3Module"


def test_recipe_source_errors(tmp_path):
    path, _ = tiny_checkpoint(tmp_path)
    base = ["knn", "--checkpoint", str(path), "--device", "cpu"]
    metric_learning = str(ROOT / "recipes" / "demo" / "mnist_gsap.yaml")
    with pytest.raises(ValueError, match="MNISTDemoDataModule .* has no bank_set/query_set"):
        main([*base, "--config", metric_learning])
    with pytest.raises(ValueError, match="either --config .* or --data"):
        main([*base, "--config", str(MOCO_RECIPE), "--data", "mnist5k"])
    with pytest.raises(ValueError, match="--data-arg .* needs --config"):
        main([*base, "--data", "mnist5k", "--data-arg", "seed=1"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        main([*base, "--config", str(MOCO_RECIPE), "--data-arg", "seed"])
    with pytest.raises(ValueError, match="data: section of .*mnist_moco_gsap.yaml"):
        main([*base, "--config", str(MOCO_RECIPE), "--data-arg", "no_such_arg=1"])
    with pytest.raises(FileNotFoundError, match="recipe .* not found"):
        main([*base, "--config", str(tmp_path / "none.yaml")])
