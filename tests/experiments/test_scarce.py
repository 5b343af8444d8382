"""``rl-gap sweep-scarce`` on the MNIST demo: every (γ, ρ, seed) trained on its subset, one table."""

import csv
import statistics
from pathlib import Path

import pytest
import yaml

from rl_gap.cli import main

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "demo"
TINY = (
    "--trainer.max_epochs 1 --trainer.check_val_every_n_epoch 1 --data.init_args.batches_per_epoch 2"
    " --model.init_args.eval_plots false --trainer.enable_progress_bar false"
    " --trainer.enable_model_summary false --trainer.limit_val_batches 1"  # 500 test queries
)


def _last_logged(run_dir):
    (path,) = Path(run_dir).glob("version_*/metrics.csv")
    last = {}
    for row in csv.DictReader(path.open()):
        last.update({k: float(v) for k, v in row.items() if v})
    return last


def recipe_validating_on_train_classes(tmp_path):
    """The demo recipe with ``val_split: 0.3``, as the SOP/iNaturalist recipes."""
    config = yaml.safe_load((RECIPES / "mnist_gsap.yaml").read_text())
    config["data"]["init_args"]["val_split"] = 0.3
    path = tmp_path / "mnist_gsap_val.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_sweep_scarce_table_from_seeded_subset_runs(tmp_path, capsys):
    """Every run reports the test split (val_split 0) though the recipe validates on held-out
    training classes: γ is then a share of all training classes."""
    out = tmp_path / "scarce"
    recipe = recipe_validating_on_train_classes(tmp_path)
    argv = ["sweep-scarce", "--recipes", str(recipe), "--fractions", "1",
            "100", "--images-per-class", "2", "--num-seeds", "2", "--output", str(out),
            "--wandb", "off", "--overrides", TINY]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rows = list(csv.DictReader((out / "scarce.csv").open()))
    assert [(r["loss"], r["rho"], float(r["gamma"])) for r in rows] == [
        ("gsap", "2", 1.0), ("gsap", "2", 100.0)
    ]  # fmt: skip
    for row, gamma in zip(rows, ("1", "100")):
        runs = [out / "gsap" / "rho_2" / f"gamma_{gamma}" / f"seed_{s}" for s in (0, 1)]
        for seed, run in zip((0, 1), runs):
            (cfg,) = run.glob("version_*/config.yaml")
            data = yaml.safe_load(cfg.read_text())["data"]["init_args"]
            assert data["class_fraction"] == float(gamma) / 100 and data["images_per_class"] == 2
            assert data["seed"] == seed
            assert data["val_split"] == 0  # val/* is the test split, not held-out train classes
        gaps = [_last_logged(r)["val/gap"] for r in runs]
        assert float(row["gAP_mean"]) == pytest.approx(statistics.fmean(gaps), abs=1e-12)
        assert float(row["gAP_std"]) == pytest.approx(statistics.stdev(gaps), abs=1e-12)
        cell = f"{100 * statistics.fmean(gaps):.2f} ± {100 * statistics.stdev(gaps):.2f}"
        assert cell in printed
    assert "| rho | gamma | gsap gAP (%) |" in printed


def test_sweep_scarce_rejects_bad_settings(tmp_path):
    recipe = str(RECIPES / "mnist_gsap.yaml")
    with pytest.raises(ValueError, match="0 < γ <= 100"):
        main(["sweep-scarce", "--recipes", recipe, "--fractions", "0", "--output", str(tmp_path)])
    glyphs = str(RECIPES / "glyphs_gsap.yaml")
    with pytest.raises(ValueError, match="class_fraction"):
        main(["sweep-scarce", "--recipes", glyphs, "--output", str(tmp_path)])


def test_sweep_scarce_refuses_a_validation_split_override(tmp_path):
    with pytest.raises(ValueError, match="reports the test split"):
        main(["sweep-scarce", "--recipes", str(RECIPES / "mnist_gsap.yaml"), "--output",
              str(tmp_path), "--overrides", "--data.init_args.val_split 0.3"])  # fmt: skip
