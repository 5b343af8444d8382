"""``python -m research.studies neg_drop|temperature`` on the MNIST demo: CSV + PNG."""

import csv
import runpy
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TINY = (
    "--trainer.max_epochs 1 --trainer.check_val_every_n_epoch 1 --data.init_args.batches_per_epoch 2"
    " --model.init_args.eval_plots false --trainer.enable_progress_bar false"
    " --trainer.enable_model_summary false --trainer.limit_val_batches 1"  # 500 test queries
)


def _script(study, argv, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["studies.py", study, *argv])
    runpy.run_path(str(ROOT / "research" / "studies.py"), run_name="__main__")


def _run_values(run_dir):
    (log,) = Path(run_dir).glob("version_*/metrics.csv")
    last = {}
    for row in csv.DictReader(log.open()):
        last.update({k: float(v) for k, v in row.items() if v})
    (cfg,) = Path(run_dir).glob("version_*/config.yaml")
    config = yaml.safe_load(cfg.read_text())
    assert config["data"]["init_args"]["val_split"] == 0  # val/* is the test split
    return last, config["model"]["init_args"]["loss"]


@pytest.mark.parametrize(
    "script, option, values, key, column",
    [
        ("neg_drop", "--alphas", ("0", "0.999"), "neg_drop", "alpha"),
        ("temperature", "--temperatures", ("0.001", "0.5"), "temperature", "tau"),
    ],
)
def test_study_writes_table_and_plot(script, option, values, key, column, tmp_path, monkeypatch):
    """Every run reports the test split (val_split 0) though the recipe validates on 30% of
    its training classes, as the SOP/iNaturalist recipes do."""
    out = tmp_path / "study"
    config = yaml.safe_load((ROOT / "recipes" / "demo" / "mnist_gsap.yaml").read_text())
    config["data"]["init_args"]["val_split"] = 0.3
    recipe = tmp_path / "mnist_gsap_val.yaml"
    recipe.write_text(yaml.safe_dump(config))
    argv = ["--recipes", str(recipe), option, *values,
            "--num-seeds", "1", "--output", str(out), "--wandb", "off", "--overrides", TINY]  # fmt: skip
    _script(script, argv, monkeypatch)
    name = script
    rows = list(csv.DictReader((out / f"{name}.csv").open()))
    assert [float(r[column]) for r in rows] == [float(v) for v in values]
    for row, value in zip(rows, values):
        metrics, loss = _run_values(
            out / "gsap" / f"{'alpha' if column == 'alpha' else 'tau'}_{float(value):g}" / "seed_0"
        )
        assert loss[key] == float(value)  # the setting reached the loss
        assert (
            float(row["gAP_mean"]) == metrics["val/gap"]
            and float(row["mAP_mean"]) == metrics["val/map"]
        )
    png = (out / f"{name}.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_study_rejects_out_of_range_settings(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="--alphas must be in"):
        _script("neg_drop", ["--alphas", "1.0", "--output", str(tmp_path)], monkeypatch)
    with pytest.raises(ValueError, match="--temperatures must be > 0"):
        _script("temperature", ["--temperatures", "0", "--output", str(tmp_path)], monkeypatch)


def test_an_unknown_study_is_named_in_a_one_line_usage(monkeypatch):
    with pytest.raises(SystemExit, match=r"\{neg_drop,temperature\} \.\.\.; got 'neg-drop'"):
        _script("neg-drop", [], monkeypatch)
