"""`rl-gap predict` writes embeddings that `rl-gap evaluate` reads with no user code."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from rl_gap.callbacks.embedding_writer import merge_parts
from rl_gap.cli import main as rl_gap_main
from rl_gap.data.metric_learning import MNISTDemoDataModule
from rl_gap.modules import MetricLearningModule
from rl_gap.resources import recipe_path
from rl_gap.training_cli import run_lightning_cli

RECIPE = str(recipe_path("demo/mnist_gsap"))
SMALL = ["--wandb", "off", "--model.init_args.backbone_kwargs", "{width: 8}",
         "--model.init_args.eval_plots", "false", "--trainer.enable_progress_bar", "false"]  # fmt: skip


def test_merge_parts_orders_by_index_and_drops_sampler_padding():
    # rank 0 got items 0, 2, 4 and rank 1 items 1, 3, 0 (0 repeated as padding)
    emb = np.arange(12, dtype=np.float32).reshape(6, 2)
    parts = [
        {"embeddings": emb[:3], "labels": np.array([10, 12, 14]), "indices": np.array([0, 2, 4])},
        {"embeddings": emb[3:], "labels": np.array([11, 13, 10]), "indices": np.array([1, 3, 0])},
    ]
    out = merge_parts(parts)
    assert out["indices"].tolist() == [0, 1, 2, 3, 4]
    assert out["labels"].tolist() == [10, 11, 12, 13, 14]
    assert out["embeddings"][:, 0].tolist() == [0, 6, 2, 8, 4]
    with pytest.raises(ValueError, match="no predictions"):
        merge_parts([{"embeddings": emb[:0], "labels": emb[:0, 0], "indices": emb[:0, 0]}])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two training steps of the MNIST demo; returns (output root, last checkpoint)."""
    out = tmp_path_factory.mktemp("runs")
    run_lightning_cli(
        ["fit", "--config", RECIPE, "--output_dir", str(out), "--trainer.max_epochs", "1",
         "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "0", *SMALL]
    )  # fmt: skip
    ckpt = out / "demo" / "mnist_gsap" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    return out, ckpt


def test_predict_then_evaluate_end_to_end(trained, tmp_path):
    out, ckpt = trained
    run_lightning_cli(
        ["predict", "--config", RECIPE, "--ckpt_path", str(ckpt), "--output_dir", str(out),
         "--data.init_args.eval_batch_size", "300", "--trainer.limit_predict_batches", "2", *SMALL]
    )  # fmt: skip
    folder = out / "demo" / "mnist_gsap" / "embeddings" / "test"
    emb, labels = np.load(folder / "embeddings.npy"), np.load(folder / "labels.npy")
    indices = np.load(folder / "indices.npy")
    assert emb.dtype == np.float32 and emb.shape == (600, 64)
    assert labels.dtype == np.int64 and indices.tolist() == list(range(600))
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["split"] == "test" and meta["arrays"]["embeddings"]["shape"] == [600, 64]
    assert meta["checkpoint"] == str(ckpt)

    # Reference: the checkpoint's encoder applied to the test digits directly.
    model = MetricLearningModule.load_from_checkpoint(ckpt, map_location="cpu").eval()
    data = MNISTDemoDataModule()
    data.setup("test")
    images, digits, _ = zip(*(data.datasets["test"][i] for i in range(600)), strict=True)
    with torch.no_grad():
        expected = model(torch.stack(images)).numpy()
    np.testing.assert_allclose(emb, expected, atol=1e-5)
    assert labels.tolist() == [int(d) for d in digits] and set(labels.tolist()) <= {5, 6, 7, 8, 9}

    # rl-gap evaluate on the written files, leave-one-out; gAP vs scikit-learn in float64.
    result = tmp_path / "metrics.json"
    code = rl_gap_main(
        ["evaluate", "--queries", str(folder / "embeddings.npy"), "--query-labels",
         str(folder / "labels.npy"), "--exclude-self", "--no-ceiling", "--output", str(result)]
    )  # fmt: skip
    assert code == 0
    metrics = json.loads(result.read_text())
    x = emb.astype(np.float64)
    sim, rel = x @ x.T, labels[:, None] == labels[None, :]
    off = ~np.eye(len(x), dtype=bool)
    assert metrics["gap"] == pytest.approx(average_precision_score(rel[off], sim[off]), abs=1e-4)


@pytest.mark.ddp
@pytest.mark.slow
def test_predict_under_ddp_merges_ranks_in_dataset_order(trained, tmp_path):
    """Two processes: each rank writes its shard, rank 0 merges; same files as one process."""
    out, ckpt = trained
    rows = ["--data.init_args.eval_batch_size", "100", "--trainer.limit_predict_batches", "2"]
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    run_lightning_cli(
        ["predict", "--config", RECIPE, "--ckpt_path", str(ckpt), "--output_dir", str(single),
         "--trainer.limit_predict_batches", "4", "--data.init_args.eval_batch_size", "100", *SMALL]
    )  # fmt: skip
    run_lightning_cli(
        ["predict", "--config", RECIPE, "--ckpt_path", str(ckpt), "--output_dir", str(ddp),
         "--trainer.devices", "2", "--trainer.strategy", "ddp_spawn", *rows, *SMALL]
    )  # fmt: skip
    a, b = (d / "demo" / "mnist_gsap" / "embeddings" / "test" for d in (single, ddp))
    # ranks take items r, r + 2, ...: 2 batches of 100 each = the first 400 items
    assert np.load(b / "indices.npy").tolist() == list(range(400))
    assert np.array_equal(np.load(a / "labels.npy"), np.load(b / "labels.npy"))
    np.testing.assert_allclose(
        np.load(a / "embeddings.npy"), np.load(b / "embeddings.npy"), atol=1e-5
    )
    assert not (b / ".parts").exists()
    assert json.loads((b / "meta.json").read_text())["world_size"] == 2
