"""``rl-gap knn`` and ``rl-gap linear-probe`` on a checkpoint of each module.

Each checkpoint records its class as ``rl-gap fit`` writes it (LightningCLI's
``_class_path`` hyper-parameter); the commands run without ``--module-class`` and
must load that class with the saved weights: their numbers equal the kNN vote and
the probe on the original module's own ``features`` (extracted here by a plain loop).
"""

from __future__ import annotations

import json

import lightning
import numpy as np
import pytest
import torch
from PIL import Image

from rl_gap.cli import main
from rl_gap.commands.knn import checkpoint_module_class
from rl_gap.commands.linear_probe import train_linear_probe
from rl_gap.data.ssl_imagefolder import ImageFolderSSLDataModule
from rl_gap.metrics.knn import weighted_knn_accuracy
from rl_gap.models.clip import tiny_clip_config

SIZE = 32


def _modules():
    from rl_gap.modules.clip_finetune import CLIPFineTuneModule
    from rl_gap.modules.metric_learning import MetricLearningModule
    from rl_gap.modules.moco_v3 import MoCoV3Module

    vit = dict(img_size=SIZE, patch_size=8, in_chans=3, depth=1, embed_dim=16, num_heads=2)
    return {
        "moco": lambda: MoCoV3Module(
            backbone="vit_tiny_patch16_224", backbone_kwargs=vit, hidden_dim=32, embed_dim=8
        ),
        "metric": lambda: MetricLearningModule(
            backbone="rl_gap_convnet", backbone_kwargs={"width": 4}, in_chans=3, dim=8
        ),
        "clip": lambda: CLIPFineTuneModule(
            model_name=None, model_config=tiny_clip_config(width=32, layers=1, context_length=16)
        ),
    }


def _checkpoint(tmp_path, name: str):
    torch.manual_seed(0)
    module = _modules()[name]()
    cls = type(module)
    path = tmp_path / f"{name}.ckpt"
    hparams = {
        "_class_path": f"{cls.__module__}.{cls.__qualname__}",
        **dict(module.hparams),
        "_instantiator": "lightning.pytorch.cli.instantiate_module",
    }
    torch.save(
        {
            "state_dict": module.state_dict(),
            "hyper_parameters": hparams,
            "pytorch-lightning_version": lightning.__version__,
        },
        path,
    )
    return path, module.eval()


@pytest.fixture(scope="module")
def image_folders(tmp_path_factory):
    """3 colour classes, 8 training and 4 evaluated RGB images each."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200)]
    for split, count in (("train", 8), ("val", 4)):
        for c, colour in enumerate(colours):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = np.clip(rng.normal(colour, 60, (SIZE, SIZE, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root / "train", root / "val"


@torch.no_grad()
def _features(module, dataset):
    feats, labels = [], []
    for i in range(len(dataset)):
        item = dataset[i]
        feats.append(module.features(item["image"][None]).float()[0])
        labels.append(int(item["label"]))
    return torch.stack(feats), torch.tensor(labels)


@pytest.mark.parametrize("name", ["moco", "metric", "clip"])
def test_knn_and_linear_probe_on_each_module(tmp_path, image_folders, name):
    path, original = _checkpoint(tmp_path, name)
    cls = type(original)
    assert checkpoint_module_class(path) == f"{cls.__module__}.{cls.__qualname__}"
    train_dir, val_dir = image_folders
    source = ["--checkpoint", str(path), "--data", "imagefolder", "--train-dir", str(train_dir),
              "--val-dir", str(val_dir), "--image-size", str(SIZE), "--device", "cpu",
              "--batch-size", "5", "--quiet"]  # fmt: skip
    knn_out, probe_out = tmp_path / "knn.json", tmp_path / "probe.json"
    assert main(["knn", *source, "--k", "3", "--output", str(knn_out)]) == 0
    assert main(["linear-probe", *source, "--epochs", "5", "--output", str(probe_out)]) == 0
    knn, probe = json.loads(knn_out.read_text()), json.loads(probe_out.read_text())
    assert knn["module_class"] == probe["module_class"] == f"{cls.__module__}.{cls.__qualname__}"

    dm = ImageFolderSSLDataModule(str(train_dir), str(val_dir), image_size=SIZE, num_workers=0)
    dm.setup("validate")
    bank, bank_labels = _features(original, dm.bank_set)
    queries, query_labels = _features(original, dm.query_set)
    want = weighted_knn_accuracy(queries, query_labels, bank, bank_labels, k=3)
    assert knn["k3/top1"] == pytest.approx(want["top1"], abs=1e-12)
    assert knn["num_bank"] == 24 and knn["num_queries"] == 12
    expected = train_linear_probe(bank, bank_labels, queries, query_labels, epochs=5, lr=0.1)
    assert probe["top1"] == pytest.approx(expected.metrics["top1"], abs=1e-6)
    assert probe["train_top1"] == pytest.approx(expected.metrics["train_top1"], abs=1e-6)


def test_module_class_precedence(tmp_path):
    path, _ = _checkpoint(tmp_path, "metric")
    # a recipe naming another class does not override what the checkpoint records
    from rl_gap.commands.knn import module_class_for

    class Args:
        module_class = None
        checkpoint = str(path)

    assert module_class_for(Args, "rl_gap.modules.moco_v3.MoCoV3Module").endswith(
        "MetricLearningModule"
    )
    Args.module_class = "rl_gap.modules.moco_v3.MoCoV3Module"  # an explicit choice wins
    assert module_class_for(Args, None) == "rl_gap.modules.moco_v3.MoCoV3Module"


def test_progress_goes_to_stderr_and_stdout_stays_json(tmp_path, image_folders, capsys):
    path, _ = _checkpoint(tmp_path, "metric")
    train_dir, val_dir = image_folders
    source = ["--checkpoint", str(path), "--data", "imagefolder", "--train-dir", str(train_dir),
              "--val-dir", str(val_dir), "--image-size", str(SIZE), "--device", "cpu",
              "--batch-size", "5"]  # fmt: skip
    assert main(["linear-probe", *source, "--epochs", "3"]) == 0
    shown = capsys.readouterr()
    assert json.loads(shown.out)["num_train"] == 24  # stdout: the JSON object alone
    assert "train features" in shown.err and "probe epochs" in shown.err and "3/3" in shown.err
    assert main(["knn", *source, "--k", "3"]) == 0
    shown = capsys.readouterr()
    assert json.loads(shown.out)["num_bank"] == 24 and "bank features" in shown.err
    assert main(["knn", *source, "--k", "3", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_a_record_beyond_the_weights_only_allow_list_is_still_read(tmp_path):
    import argparse

    path, _ = _checkpoint(tmp_path, "metric")
    ckpt = torch.load(path, weights_only=False)
    ckpt["extra"] = argparse.Namespace(a=1)  # torch's weights_only loader refuses it
    torch.save(ckpt, path)
    assert checkpoint_module_class(path) == "rl_gap.modules.metric_learning.MetricLearningModule"
    legacy = tmp_path / "legacy.ckpt"
    torch.save(
        {"hyper_parameters": {"_class_path": "a.B"}}, legacy, _use_new_zipfile_serialization=False
    )
    assert checkpoint_module_class(legacy) == "a.B"
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    assert checkpoint_module_class(tmp_path / "junk.ckpt") is None
