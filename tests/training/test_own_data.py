"""The README's "Your own data" commands on tiny data: fit, predict, evaluate.

Metrics of ``rl-gap evaluate`` on the predict folder are checked against
scikit-learn's average precision of the written embeddings (float64).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from sklearn.metrics import average_precision_score

from rl_gap.cli import main
from rl_gap.models.clip import tiny_clip_config

REPO = Path(__file__).resolve().parents[2]
FOLDER_RECIPE = str(REPO / "recipes" / "metric_learning" / "imagefolder_gsap.yaml")
CAPTION_RECIPE = str(REPO / "recipes" / "clip" / "captions_gsap.yaml")
CPU = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.precision", "32",
       "--trainer.enable_progress_bar", "false", "--wandb", "off"]  # fmt: skip


def _image(path: Path, seed: int, size: int = 20) -> None:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path)


def _class_folders(root: Path, classes: list[str], per_class: int, seed: int) -> str:
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            _image(root / name / f"{i}.png", seed + 100 * c + i)
    return str(root)


def _gap(scores: np.ndarray, relevant: np.ndarray, valid: np.ndarray) -> float:
    return float(average_precision_score(relevant[valid].ravel(), scores[valid].ravel()))


def _run_folder(output: Path, recipe: str) -> Path:
    (folder,) = (output / Path(recipe).parent.name / Path(recipe).stem).glob("seed0*")
    return folder


def test_image_folders_fit_predict_evaluate(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    train = _class_folders(tmp_path / "train", ["a", "b", "c", "d"], 4, seed=0)
    test = _class_folders(tmp_path / "test", ["e", "f", "g"], 3, seed=50)
    data = ["--config", FOLDER_RECIPE, "--data.init_args.train", train,
            "--data.init_args.test", test, "--output_dir", str(tmp_path / "runs")]  # fmt: skip
    tiny = ["--model.init_args.backbone", "rl_gap_convnet", "--model.init_args.backbone_kwargs",
            "{width: 4}", "--model.init_args.dim", "8", "--data.init_args.batch_size", "8",
            "--data.init_args.m_per_class", "2", "--data.init_args.num_workers", "0",
            "--data.init_args.image_size", "16", "--data.init_args.val_split", "0",
            "--data.init_args.eval_batch_size", "16", "--model.init_args.eval_plots", "false"]  # fmt: skip
    assert main(["fit", *data, *tiny, *CPU, "--trainer.max_steps", "2",
                 "--trainer.check_val_every_n_epoch", "1"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "preprocessing: 16px, mean (0.485, 0.456, 0.406)" in err and "bilinear" in err
    assert "batch: 8 global (the batch the loss ranks) = 1 rank(s) x 8 per device" in err
    run = _run_folder(tmp_path / "runs", FOLDER_RECIPE)
    saved = yaml.safe_load((run / "version_0" / "config.yaml").read_text())
    assert saved["data"]["init_args"]["preprocess"] == {
        "image_size": 16, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
        "interpolation": "bilinear", "crop_pct": 0.875, "resize_mode": "shortest",
    }  # fmt: skip
    ckpt = str(run / "checkpoints" / "last.ckpt")
    assert main(["predict", *data, *tiny, *CPU, "--ckpt_path", ckpt]) == 0
    folder = run / "embeddings" / "test"
    out = tmp_path / "metrics.json"
    assert main(["evaluate", "--queries", str(folder), "--output", str(out)]) == 0
    got = json.loads(out.read_text())
    x = torch.from_numpy(np.load(folder / "embeddings.npy"))
    y = np.load(folder / "labels.npy")
    assert len(y) == 9 and x.dtype == torch.float32
    # float32 embeddings are scored in float32 (a tiny model's near-ties can swap in float64);
    # one number per unordered pair, as the engine's leave-one-out mirror gives
    upper = torch.triu(x @ x.T).double().numpy()
    scores = upper + np.triu(upper, 1).T
    valid = ~np.eye(9, dtype=bool)  # leave-one-out
    assert got["gap"] == pytest.approx(_gap(scores, y[:, None] == y[None], valid), abs=1e-6)


def test_caption_tables_fit_with_held_out_retrieval_predict_evaluate(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = ["filepath,title"]
    for i in range(8):
        _image(tmp_path / f"t{i}.png", i, size=40)
        rows.append(f"t{i}.png,a training picture number {i}")
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    rows = ["filepath,title"]
    for i in range(3):
        _image(tmp_path / f"h{i}.png", 20 + i, size=40)
        rows += [f"h{i}.png,held out picture {i}", f"h{i}.png,another caption of {i}"]
    (tmp_path / "heldout.csv").write_text("\n".join(rows) + "\n")
    data = ["--config", CAPTION_RECIPE, "--data.init_args.train_table", str(tmp_path / "train.csv"),
            "--data.init_args.retrieval", f"[{{name: heldout, table: {tmp_path / 'heldout.csv'}}}]",
            "--output_dir", str(tmp_path / "runs")]  # fmt: skip
    tiny = ["--model.init_args.model_name", "null", "--model.init_args.pretrained", "null",
            "--model.init_args.model_config", json.dumps(tiny_clip_config(width=32, context_length=16)),
            "--data.init_args.batch_size", "4", "--data.init_args.num_workers", "0"]  # fmt: skip
    assert main(["fit", *data, *tiny, *CPU, "--trainer.max_steps", "2",
                 "--trainer.check_val_every_n_epoch", "1", "--trainer.max_epochs", "1"]) == 0  # fmt: skip
    run = _run_folder(tmp_path / "runs", CAPTION_RECIPE)
    header, *values = (run / "version_0" / "metrics.csv").read_text().splitlines()
    assert "val/heldout/i2t_gap" in header.split(",")
    ckpt = str(run / "checkpoints" / "last.ckpt")
    assert main(["predict", *data, *tiny, *CPU, "--ckpt_path", ckpt]) == 0
    folder = run / "embeddings" / "heldout"
    out = tmp_path / "metrics.json"
    assert main(["evaluate", "--queries", str(folder), "--output", str(out)]) == 0
    got = json.loads(out.read_text())
    images = np.load(folder / "image_embeddings.npy").astype(np.float64)
    texts = np.load(folder / "text_embeddings.npy").astype(np.float64)
    image_group, text_group = (
        np.load(folder / "image_labels.npy"),
        np.load(folder / "text_labels.npy"),
    )
    assert images.shape[0] == 3 and texts.shape[0] == 6  # each image once, every caption
    relevant = image_group[:, None] == text_group[None]
    assert relevant.sum() == 6
    valid = np.ones_like(relevant)
    assert got["gap"] == pytest.approx(_gap(images @ texts.T, relevant, valid), abs=1e-6)
