"""``rl-gap tune`` on the MNIST demo: search on a class split, seeds, table, determinism, resume."""

import csv
import json
import shlex
import statistics
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from rl_gap.cli import main
from rl_gap.data.mnist import load_mnist_5k

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "demo"
# 3 training classes after the 30 % hold-out: batches of 3 digits x 20
TINY = (
    "--trainer.max_epochs 1 --trainer.check_val_every_n_epoch 1 --data.init_args.batches_per_epoch 2"
    " --data.init_args.batch_size 60 --model.init_args.eval_plots false"
    " --trainer.enable_progress_bar false --trainer.enable_model_summary false"
)


def _tune(out, *extra):
    argv = ["tune", "--recipes", str(RECIPES / "mnist_gsap.yaml"), "--n-trials", "2",
            "--num-seeds", "2", "--output", str(out), "--wandb", "off", "--overrides", TINY,
            "--final-overrides", "--trainer.limit_val_batches 1", *extra]  # fmt: skip
    assert main(argv) == 0


def _csv_log(run_dir):
    """Last logged value per column of the run's Lightning CSV log (independent of result.json)."""
    (path,) = Path(run_dir).glob("version_*/metrics.csv")
    last = {}
    for row in csv.DictReader(path.open()):
        last.update({k: float(v) for k, v in row.items() if v})
    return last


def _config(run_dir):
    (path,) = Path(run_dir).glob("version_*/config.yaml")
    return yaml.safe_load(path.read_text())


def test_tune_table_is_mean_std_of_final_runs_and_reproducible(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "a"
    _tune(out)
    study = optuna.load_study(study_name="tune:gsap", storage=f"sqlite:///{out / 'optuna.db'}")
    assert len(study.trials) == 2
    _, labels = load_mnist_5k()
    per_digit = np.bincount(labels)[:5]
    two_digit_sizes = {int(a + b) for i, a in enumerate(per_digit) for b in per_digit[i + 1 :]}
    for trial in study.trials:
        assert 1e-5 <= trial.params["lr"] <= 5e-4 and 1e-4 <= trial.params["temperature"] <= 5e-2
        run = out / "trials" / "gsap" / f"trial_{trial.number}"
        cfg = _config(run)
        assert cfg["data"]["init_args"]["val_split"] == 0.3
        assert cfg["model"]["init_args"]["lr"] == trial.params["lr"]
        assert cfg["model"]["init_args"]["loss"]["temperature"] == trial.params["temperature"]
        log = _csv_log(run)
        # objective = gAP on the 2 held-out training digits (30 % of 5), not on the test digits
        assert int(log["val/num_queries"]) in two_digit_sizes
        assert trial.value == pytest.approx(log["val/gap"])
    best = max(study.trials, key=lambda t: t.value)
    finals = [out / "final" / "gsap" / f"trial_{best.number}" / f"seed_{s}" for s in (0, 1)]
    logs = [_csv_log(f) for f in finals]
    for seed, f, log in zip((0, 1), finals, logs):
        cfg = _config(f)
        assert cfg["seed_everything"] == seed and cfg["data"]["init_args"]["seed"] == seed
        assert cfg["data"]["init_args"]["val_split"] == 0.0
        assert cfg["model"]["init_args"]["lr"] == best.params["lr"]
        assert int(log["val/num_queries"]) == 500  # limit_val_batches 1 of the test digits
    (row,) = list(csv.DictReader((out / "results.csv").open()))
    for name, key in [("gAP", "val/gap"), ("mAP", "val/map"), ("R@1", "val/r@1"),
                      ("R@P90", "val/protocol_r@p90"), ("F1g", "val/protocol_f1g"),
                      ("F1q", "val/protocol_f1q")]:  # fmt: skip
        values = [log[key] for log in logs]
        assert float(row[f"{name}_mean"]) == pytest.approx(statistics.fmean(values), abs=1e-12)
        assert float(row[f"{name}_std"]) == pytest.approx(statistics.stdev(values), abs=1e-12)
    assert float(row["lr"]) == best.params["lr"] and float(row["val_gap"]) == best.value
    md = (out / "results.md").read_text()
    assert f"{100 * statistics.fmean(log['val/gap'] for log in logs):.2f} ± " in md
    # the same folder with other arguments: an error, not a silently reused run
    with pytest.raises(ValueError, match="trained with other arguments"):
        _tune(out, "--final-overrides", "--trainer.limit_val_batches 2")


def test_same_command_same_table_and_resume_adds_only_missing_trials(tmp_path, capsys):
    one = ("--n-trials", "1", "--num-seeds", "1")
    _tune(tmp_path / "a", *one)
    err = capsys.readouterr().err  # progress: one stderr line per finished trial and seed
    assert "[tune] gsap search: 1/1 done (trial 0: val gAP" in err
    assert "[tune] gsap final seeds: 1/1 done (seed 0: gAP" in err
    _tune(tmp_path / "b", *one, "--quiet")
    assert "[tune]" not in capsys.readouterr().err
    a, b = (tmp_path / d / "results.csv" for d in "ab")
    assert a.read_text() == b.read_text() and len(a.read_text().splitlines()) == 2
    out = tmp_path / "a"
    first = out / "trials" / "gsap" / "trial_0" / "result.json"
    stamp = first.stat().st_mtime_ns
    _tune(out, "--n-trials", "2", "--stage", "search")
    assert "[tune] gsap search: 2/2 done (trial 1" in capsys.readouterr().err  # resumed at 1/2
    study = optuna.load_study(study_name="tune:gsap", storage=f"sqlite:///{out / 'optuna.db'}")
    assert len(study.trials) == 2 and first.stat().st_mtime_ns == stamp
    assert json.loads((out / "trials/gsap/trial_1/result.json").read_text())["seed"] == 0


def test_tune_rejects_bad_settings(tmp_path):
    recipe = str(RECIPES / "mnist_gsap.yaml")
    with pytest.raises(ValueError, match="--n-trials"):
        main(["tune", "--recipes", recipe, "--n-trials", "0", "--output", str(tmp_path)])
    with pytest.raises(ValueError, match="--val-split"):
        main(["tune", "--recipes", recipe, "--val-split", "1.0", "--output", str(tmp_path)])
    with pytest.raises(RuntimeError, match="run --stage search first"):
        main(["tune", "--recipes", recipe, "--stage", "final", "--output", str(tmp_path)])
    with pytest.raises(FileNotFoundError, match="no_such.yaml"):
        main(["tune", "--recipes", str(tmp_path / "no_such.yaml"), "--output", str(tmp_path)])


@pytest.mark.slow
def test_tune_trials_as_child_processes_logged_to_one_wandb_group(tmp_path, run_dir):
    out = tmp_path / "sub"
    _tune(out, "--n-trials", "1", "--num-seeds", "1", "--wandb", "offline", "--name", "grpX",
          "--trial-command", f"{shlex.quote(sys.executable)} -m rl_gap.cli")  # fmt: skip
    rows = list(csv.DictReader((out / "final_runs.csv").open()))
    log = _csv_log(out / "final" / "gsap" / "trial_0" / "seed_0")
    assert float(rows[0]["gAP"]) == pytest.approx(log["val/gap"])
    runs = list(out.rglob("offline-run-*/run-*.wandb"))
    assert len(runs) == 3  # trial, final seed, summary
    assert all(b"grpX" in p.read_bytes() for p in runs), "every run is in the W&B group"
