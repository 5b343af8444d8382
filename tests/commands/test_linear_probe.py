"""Linear probe: converges to scikit-learn's L2-regularised logistic regression optimum."""

from __future__ import annotations

import json

import lightning
import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from rl_gap.cli import main
from rl_gap.commands.linear_probe import train_linear_probe
from rl_gap.modules.moco_v3 import MoCoV3Module


def _objective(w, b, x, y, wd):
    """mean cross-entropy + (wd / 2)·||W||², float64."""
    logits = x @ w.T + b
    logits = logits - logits.max(1, keepdims=True)
    log_prob = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return -log_prob[np.arange(len(y)), y].mean() + 0.5 * wd * (w**2).sum()


def _blobs(n, seed):
    rng = np.random.default_rng(seed)
    centers = np.array([[1.0, 0, 0, 0.5, 0, 0], [0, 1.0, 0, 0, 0.5, 0], [0, 0, 1.0, 0, 0, 0.5]])
    y = rng.integers(0, 3, n)
    return centers[y] + 0.8 * rng.standard_normal((n, 6)), y


def test_probe_reaches_sklearn_logistic_regression_optimum():
    x, y = _blobs(300, 0)
    xv, yv = _blobs(200, 1)
    wd = 0.01
    result = train_linear_probe(
        torch.tensor(x, dtype=torch.float32), torch.tensor(y), torch.tensor(xv, dtype=torch.float32),
        torch.tensor(yv), epochs=300, lr=0.5, batch_size=300, weight_decay=wd, standardize=False,
    )  # fmt: skip
    # sklearn minimises 0.5·||W||² + C·Σ CE  <=>  mean CE + (1 / (2nC))·||W||².
    sk = LogisticRegression(C=1.0 / (len(y) * wd), tol=1e-10, max_iter=10_000).fit(x, y)
    ours = _objective(result.weight.double().numpy(), result.bias.double().numpy(), x, y, wd)
    best = _objective(sk.coef_, sk.intercept_, x, y, wd)
    assert ours == pytest.approx(best, abs=1e-4)
    sk_val_top1 = float((sk.predict(xv) == yv).mean())
    assert result.metrics["top1"] == pytest.approx(sk_val_top1, abs=0.011)
    assert 0.5 < result.metrics["top1"] < 1.0 and result.metrics["top5"] == 1.0


def test_probe_standardizes_and_rejects_bad_input():
    x, y = _blobs(120, 2)
    scaled = torch.tensor(x * 1000.0 + 50.0, dtype=torch.float32)
    result = train_linear_probe(scaled, torch.tensor(y), scaled, torch.tensor(y), epochs=30)
    torch.testing.assert_close(result.mean, scaled.mean(0))
    assert result.metrics["train_top1"] > 0.6
    with pytest.raises(ValueError, match="NaN"):
        bad = scaled.clone()
        bad[0, 0] = float("nan")
        train_linear_probe(bad, torch.tensor(y), scaled, torch.tensor(y))
    with pytest.raises(ValueError, match="labels"):
        train_linear_probe(scaled, torch.tensor(y[:5]), scaled, torch.tensor(y))


def test_linear_probe_command_on_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    module = MoCoV3Module(
        backbone="vit_tiny_patch16_224",
        backbone_kwargs=dict(
            img_size=28, patch_size=7, in_chans=1, depth=1, embed_dim=16, num_heads=2
        ),
        hidden_dim=32,
        embed_dim=8,
    )
    ckpt = tmp_path / "tiny.ckpt"
    hparams = dict(module.hparams)
    version = lightning.__version__
    torch.save(
        {
            "state_dict": module.state_dict(),
            "hyper_parameters": hparams,
            "pytorch-lightning_version": version,
        },
        ckpt,
    )
    out = tmp_path / "probe.json"
    argv = ["linear-probe", "--checkpoint", str(ckpt), "--data", "mnist5k", "--num-train", "4500",
            "--device", "cpu", "--epochs", "5", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["num_train"] == 4500 and result["num_val"] == 500
    # Random frozen features of digits still separate them far above chance (0.1).
    assert 0.3 < result["top1"] <= 1.0


@pytest.mark.parametrize("option", ["--epochs", "--probe-batch-size"])
def test_linear_probe_options_checked_before_the_feature_pass(tmp_path, option):
    from rl_gap.cli import main

    # the checkpoint does not even exist: the option error comes first
    argv = ["linear-probe", "--checkpoint", str(tmp_path / "none.ckpt"), "--data", "mnist5k",
            option, "0"]  # fmt: skip
    with pytest.raises(ValueError, match=f"{option} must be >= 1"):
        main(argv)


def test_linear_probe_takes_the_datasets_of_a_recipes_datamodule(tmp_path):
    from pathlib import Path

    from rl_gap.commands.knn import extract_features
    from rl_gap.data.ssl_mnist import MNIST5kSSLDataModule

    torch.manual_seed(2)
    module = MoCoV3Module(
        backbone="vit_tiny_patch16_224",
        backbone_kwargs=dict(img_size=28, patch_size=7, in_chans=1, depth=1, embed_dim=16,
                             num_heads=2),
        hidden_dim=32,
        embed_dim=8,
    )  # fmt: skip
    ckpt = tmp_path / "tiny.ckpt"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
                "pytorch-lightning_version": lightning.__version__}, ckpt)  # fmt: skip
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "demo" / "mnist_moco_infonce.yaml"
    out = tmp_path / "probe.json"
    argv = ["linear-probe", "--checkpoint", str(ckpt), "--config", str(recipe), "--device", "cpu",
            "--data-arg", "num_train=4500", "--epochs", "3", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["num_train"] == 4500 and result["num_val"] == 500
    dm = MNIST5kSSLDataModule(num_train=4500, crop_min=0.3, batch_size=256, eval_batch_size=500)
    dm.setup("validate")
    module.eval()
    reference = train_linear_probe(
        *extract_features(module, dm.bank_set), *extract_features(module, dm.query_set), epochs=3
    )
    assert result["top1"] == pytest.approx(reference.metrics["top1"], abs=1e-12)
