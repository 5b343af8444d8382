"""Model selection never looks at the test split; the run says what validation is."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint

from rl_gap.callbacks.selection import guard_model_selection
from rl_gap.data.metric_learning import MNISTDemoDataModule
from rl_gap.modules import MetricLearningModule

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
TINY = dict(backbone="rl_gap_convnet", backbone_kwargs={"width": 4}, in_chans=1, dim=8)


def _fit(tmp_path: Path, val_split: float) -> tuple[ModelCheckpoint, MNISTDemoDataModule]:
    torch.manual_seed(0)
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path / "checkpoints", monitor="val/gap", mode="max", save_last=True
    )
    dm = MNISTDemoDataModule(
        val_split=val_split, batch_size=60, m_per_class=20, batches_per_epoch=2, eval_batch_size=60
    )
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path, max_epochs=1, limit_val_batches=1, num_sanity_val_steps=0,
        callbacks=[checkpoint],
    )  # fmt: skip
    trainer.fit(MetricLearningModule(**TINY, eval_plots=False), datamodule=dm)
    return checkpoint, dm


def test_validation_on_test_split_selects_no_checkpoint(tmp_path, capsys):
    checkpoint, dm = _fit(tmp_path, val_split=0.0)
    out = capsys.readouterr().out
    assert "validation = test split; no checkpoint selection (monitor val/gap dropped" in out
    assert dm.datasets["val"] is dm.datasets["test"]
    # only last.ckpt: no file was kept for being best on the test split
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.ckpt"]
    assert checkpoint.monitor is None and checkpoint.best_model_path == ""


def test_held_out_training_classes_drive_selection(tmp_path, capsys):
    checkpoint, dm = _fit(tmp_path, val_split=0.4)
    out = capsys.readouterr().out
    assert "validation: held-out 40% of training classes; checkpoint selection on val/gap" in out
    # validation images are of 2 of the 5 training digits (0-4), none of the test digits
    val_digits = set(torch.unique(dm.datasets["val"].labels).tolist())
    train_digits = set(torch.unique(dm.datasets["train"].labels).tolist())
    assert len(val_digits) == 2 and val_digits | train_digits == {0, 1, 2, 3, 4}
    assert not val_digits & train_digits
    assert checkpoint.monitor == "val/gap" and Path(checkpoint.best_model_path).is_file()


def test_datamodule_without_a_held_out_split_is_treated_as_test(capsys):
    checkpoint = ModelCheckpoint(monitor="val/flickr30k/i2t_gap", mode="max")
    trainer = SimpleNamespace(checkpoint_callbacks=[checkpoint], datamodule=object())
    line = guard_model_selection(trainer)
    assert line.startswith("validation = test split; no checkpoint selection")
    assert checkpoint.monitor is None and checkpoint.save_top_k == 0 and checkpoint.save_last
    assert guard_model_selection(trainer) == line  # once per trainer
    assert capsys.readouterr().out.count("validation = test split") == 1


@pytest.mark.parametrize("recipe", sorted((RECIPES / "metric_learning").glob("*.yaml")))
def test_paper_metric_learning_recipes_validate_on_held_out_classes(recipe):
    config = yaml.safe_load(recipe.read_text())
    assert config["data"]["init_args"]["val_split"] == 0.3
    monitors = [
        c["init_args"].get("monitor")
        for c in config["trainer"]["callbacks"]
        if c["class_path"].endswith("ModelCheckpoint")
    ]
    assert monitors == ["val/gap"]


@pytest.mark.parametrize(
    "recipe", sorted([*(RECIPES / "clip").glob("*.yaml"), *(RECIPES / "moco_v3").glob("*.yaml")])
)
def test_clip_and_moco_recipes_never_select_on_their_evaluation_sets(recipe):
    config = yaml.safe_load(recipe.read_text())
    callbacks = config["trainer"].get("callbacks") or []
    paths = [c["class_path"] for c in callbacks]
    assert "rl_gap.callbacks.ModelSelectionGuard" in paths
    assert not any(c.get("init_args", {}).get("monitor") for c in callbacks)


def test_val_split_that_leaves_no_class_says_why():
    with pytest.raises(ValueError, match="leaving no class to train on"):
        MNISTDemoDataModule(val_split=0.95).setup("fit")
    with pytest.raises(ValueError, match="nothing to validate on"):
        MNISTDemoDataModule(val_split=0.05).setup("fit")


@pytest.mark.parametrize("bad", [0, -2, 1.5])
def test_queries_per_class_checked_at_construction(bad):
    with pytest.raises(ValueError, match="queries_per_class"):
        MNISTDemoDataModule(queries_per_class=bad)
