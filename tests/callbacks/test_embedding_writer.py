"""`rl-gap predict` writes embeddings that `rl-gap evaluate` reads with no user code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from rl_gap.callbacks.embedding_writer import merge_parts
from rl_gap.cli import main as rl_gap_main
from rl_gap.data.glyphs import DEJAVU_DIR
from rl_gap.data.metric_learning import MNISTDemoDataModule
from rl_gap.modules import MetricLearningModule
from rl_gap.resources import recipe_path
from rl_gap.training.cli import run_lightning_cli

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
    cli = run_lightning_cli(
        ["fit", "--config", RECIPE, "--output_dir", str(out), "--trainer.max_epochs", "1",
         "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "0", *SMALL]
    )  # fmt: skip
    ckpt = Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    return out, ckpt


def test_predict_then_evaluate_end_to_end(trained, tmp_path, recwarn):
    out, ckpt = trained
    cli = run_lightning_cli(
        ["predict", "--config", RECIPE, "--ckpt_path", str(ckpt), "--output_dir", str(out),
         "--data.init_args.eval_batch_size", "300", "--trainer.limit_predict_batches", "2", *SMALL]
    )  # fmt: skip
    # predict runs in the checkpoint's own run folder; the fit's checkpoint callback
    # state is not restored (predict saves nothing), so no "dirpath has changed" warning
    assert Path(cli.trainer.default_root_dir) == ckpt.parent.parent
    assert not [w for w in recwarn if "dirpath has changed" in str(w.message)]
    folder = ckpt.parent.parent / "embeddings" / "test"  # next to the checkpoint's run
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
    _, ckpt = trained
    copies = {}
    for name in ("single", "ddp"):  # two run folders, each holding a copy of the checkpoint
        (tmp_path / name / "checkpoints").mkdir(parents=True)
        copies[name] = tmp_path / name / "checkpoints" / "last.ckpt"
        shutil.copy(ckpt, copies[name])
    common = ["predict", "--config", RECIPE, "--output_dir", str(tmp_path / "predict"),
              "--data.init_args.eval_batch_size", "100", *SMALL]  # fmt: skip
    run_lightning_cli([*common, "--ckpt_path", str(copies["single"]),
                       "--trainer.limit_predict_batches", "4"])  # fmt: skip
    run_lightning_cli([*common, "--ckpt_path", str(copies["ddp"]), "--trainer.devices", "2",
                       "--trainer.strategy", "ddp_spawn", "--trainer.limit_predict_batches", "2"])  # fmt: skip
    a, b = (tmp_path / name / "embeddings" / "test" for name in ("single", "ddp"))
    # ranks take items r, r + 2, ...: 2 batches of 100 each = the first 400 items
    assert np.load(b / "indices.npy").tolist() == list(range(400))
    assert np.array_equal(np.load(a / "labels.npy"), np.load(b / "labels.npy"))
    np.testing.assert_allclose(
        np.load(a / "embeddings.npy"), np.load(b / "embeddings.npy"), atol=1e-5
    )
    assert not (b / ".parts").exists()
    assert json.loads((b / "meta.json").read_text())["world_size"] == 2


def test_moco_predict_writes_bank_and_evaluated_features(run_dir):
    """MoCo v3 demo: unit-norm backbone features of the kNN bank (train) and of the
    evaluated images (val), rows in dataset order, labels the digits."""
    cli = run_lightning_cli(
        ["predict", "--config", str(recipe_path("demo/mnist_moco_infonce")),
         "--output_dir", str(run_dir), "--data.init_args.eval_batch_size", "20",
         "--initial_weights", "true",
         "--trainer.limit_predict_batches", "2", "--wandb", "off",
         "--trainer.enable_progress_bar", "false"]
    )  # fmt: skip
    root = Path(cli.trainer.default_root_dir) / "embeddings"
    loaders = cli.trainer.predict_dataloaders
    model = cli.model.eval()
    for split, loader in zip(("train", "val"), loaders, strict=True):
        emb, labels = np.load(root / split / "embeddings.npy"), np.load(root / split / "labels.npy")
        items = [loader.dataset[i] for i in range(40)]
        with torch.no_grad():
            feats = model.features(torch.stack([it["image"] for it in items])).double()
        expected = (feats / feats.norm(dim=1, keepdim=True)).numpy()
        np.testing.assert_allclose(emb, expected, atol=1e-5)
        assert labels.dtype == np.int64 and labels.tolist() == [it["label"] for it in items]


@pytest.mark.skipif(
    not Path(DEJAVU_DIR, "DejaVuSans.ttf").is_file(),
    reason="DejaVu fonts missing (apt-get install fonts-dejavu-core)",
)
def test_clip_predict_writes_image_and_text_embeddings_with_pair_ids(tmp_path, monkeypatch):
    """CLIP glyph demo: each retrieval set gets image_/text_ embeddings + group (pair) ids,
    the zero-shot set embeddings + class labels; rl-gap evaluate reads image->text."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cli = run_lightning_cli(
        ["predict", "--config", str(recipe_path("demo/glyphs_gsap")),
         "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}",
         "--initial_weights=true",
         "--data.init_args.train_renders=1", "--data.init_args.eval_renders=1",
         "--data.init_args.eval_seen=false", "--data.init_args.batch_size=32"]
    )  # fmt: skip
    model = cli.model.eval()
    datasets = [loader.dataset for loader in cli.trainer.predict_dataloaders]
    retrieval = {d.eval_role: d for d in datasets if d.eval_role != "zero_shot"}
    root = Path(cli.trainer.default_root_dir) / "embeddings"
    folder = root / retrieval["retrieval_images"].eval_name
    images, texts = retrieval["retrieval_images"], retrieval["retrieval_texts"]
    img = np.load(folder / "image_embeddings.npy")
    txt = np.load(folder / "text_embeddings.npy")
    assert img.shape[0] == len(images) and txt.shape[0] == len(texts)
    assert np.load(folder / "image_labels.npy").tolist() == images.groups
    assert np.load(folder / "text_labels.npy").tolist() == texts.groups
    with torch.no_grad():
        ref_img = model.encode_image(torch.stack([images[i]["image"] for i in range(4)]))
        ref_txt = model.encode_text([texts[i]["text"] for i in range(4)])
    np.testing.assert_allclose(img[:4], ref_img.numpy(), atol=1e-4)
    np.testing.assert_allclose(txt[:4], ref_txt.numpy(), atol=1e-4)
    (zs,) = [d for d in datasets if d.eval_role == "zero_shot"]
    assert np.load(root / zs.eval_name / "labels.npy").tolist() == list(zs.labels)
    out = tmp_path / "i2t.json"
    assert rl_gap_main(
        ["evaluate", "--queries", str(folder / "image_embeddings.npy"), "--query-labels",
         str(folder / "image_labels.npy"), "--database", str(folder / "text_embeddings.npy"),
         "--database-labels", str(folder / "text_labels.npy"), "--no-ceiling", "--output", str(out)]
    ) == 0  # fmt: skip
    x, y = img.astype(np.float64), txt.astype(np.float64)
    rel = np.load(folder / "image_labels.npy")[:, None] == np.load(folder / "text_labels.npy")
    gap = average_precision_score(rel.ravel(), (x @ y.T).ravel())
    assert json.loads(out.read_text())["gap"] == pytest.approx(gap, abs=1e-4)
