"""``rl-gap tune`` killed mid-trial: the restart fails the dead trial, redoes it with the same
(lr, τ), and the table counts completed trials only; a single seed is reported as n = 1."""

import argparse
import csv
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from rl_gap.cli import main
from rl_gap.commands.tune import WORKER_ATTR, add_arguments, open_storage, search, summary_table
from rl_gap.experiments.tables import aggregate, cell

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "demo" / "mnist_gsap.yaml"
TINY = (
    "--trainer.max_epochs 1 --trainer.check_val_every_n_epoch 1 --data.init_args.batches_per_epoch 2"
    " --data.init_args.batch_size 60 --model.init_args.eval_plots false"
    " --trainer.enable_progress_bar false --trainer.enable_model_summary false"
    " --model.init_args.backbone_kwargs '{width: 8}'"
)


def _argv(out, *extra):
    return ["tune", "--recipes", str(RECIPE), "--n-trials", "2", "--num-seeds", "1",
            "--output", str(out), "--wandb", "off", "--overrides", TINY,
            "--final-overrides", "--trainer.limit_val_batches 1", *extra]  # fmt: skip


@pytest.mark.slow
def test_tune_killed_mid_trial_redoes_it_and_counts_completed_trials(tmp_path, capsys):
    out = tmp_path / "t"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    log = (tmp_path / "search.err").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "rl_gap.cli", *_argv(out, "--stage", "search")],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=log)  # fmt: skip
    second = out / "trials" / "gsap" / "trial_1"
    deadline = time.monotonic() + 600
    while not second.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert second.exists(), (
        f"the search never reached its second trial: {(tmp_path / 'search.err').read_text()[-3000:]}"
    )
    proc.send_signal(signal.SIGKILL)  # the worker dies mid-trial: no chance to clean up
    proc.wait(timeout=60)
    log.close()
    storage = f"sqlite:///{out / 'optuna.db'}"
    killed = optuna.load_study(study_name="tune:gsap", storage=storage).trials
    assert [t.state for t in killed] == [TrialState.COMPLETE, TrialState.RUNNING]

    assert main(_argv(out)) == 0  # the same command again, well within the heartbeat grace
    assert "trial(s) [1] were left running by a worker that is gone" in capsys.readouterr().out
    trials = optuna.load_study(study_name="tune:gsap", storage=storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert trials[2].params == killed[1].params  # redone with the same sampler seed
    (row,) = list(csv.DictReader((out / "results.csv").open()))
    assert int(row["trials"]) == 2
    best = max((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    assert float(row["val_gap"]) == best.value
    md = (out / "results.md").read_text()
    assert "one seed (n = 1)" in md and " ± " not in md.split("\n\n")[1]


def test_a_single_seed_is_reported_as_n_1_not_plus_minus_zero():
    rows = [{"loss": "gsap", "gAP": 0.1234, "mAP": 0.5, "R@1": 0.6, "R@P90": 0.1,
             "F1g": 0.2, "F1q": 0.3}]  # fmt: skip
    (one,) = aggregate(rows, ["loss"])
    assert cell(one, "gAP") == "12.34 (n = 1)"
    (two,) = aggregate([rows[0], {**rows[0], "gAP": 0.1334}], ["loss"])
    assert cell(two, "gAP") == f"12.84 ± {100 * (0.005 * 2**0.5):.2f}"  # sample std of 2 values
    table = summary_table([{**one, "lr": 1e-4, "temperature": 0.01, "val_gap": 0.2, "trials": 3}])
    assert "± 0.00" not in table and "(n = 1)" in table


@pytest.mark.parametrize("pid_alive", [False, True])
def test_only_trials_of_dead_local_workers_are_failed(tmp_path, pid_alive):
    from rl_gap.commands.tune import fail_dead_trials

    storage = open_storage(f"sqlite:///{tmp_path / 'db.sqlite'}")
    study = optuna.create_study(study_name="s", storage=storage)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True)  # fmt: skip
    pid = os.getppid() if pid_alive else int(done.stdout)  # a live process / one that is gone
    local = study.ask()
    local.set_user_attr(WORKER_ATTR, {"host": socket.gethostname(), "pid": pid})
    remote = study.ask()  # another host, heartbeat fresh: must be left alone
    remote.set_user_attr(WORKER_ATTR, {"host": "elsewhere", "pid": pid})
    failed = fail_dead_trials(study)
    assert failed == ([] if pid_alive else [local.number])
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.RUNNING if pid_alive else TrialState.FAIL, TrialState.RUNNING]


class _FakeRunner:
    """Stands for the training runs: val/gap is a known function of the trial's lr."""

    def __init__(self):
        self.calls = []

    def run(self, recipe, run_dir, seed, overrides, job_type="train"):
        lr = float(overrides[overrides.index("--model.init_args.lr") + 1])
        self.calls.append(lr)
        return {"val/gap": 1.0 / (1.0 + abs(math.log10(lr) + 4.0))}


def test_search_fails_a_dead_workers_trial_and_redoes_it_with_the_same_seed(tmp_path):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--recipes", str(RECIPE), "--n-trials", "1", "--seed", "3"])
    storage = open_storage(f"sqlite:///{tmp_path / 'db.sqlite'}")
    runner = _FakeRunner()
    search(args, runner, str(RECIPE), "gsap", storage, tmp_path)
    # the second trial of an uninterrupted search, started by a worker that then died
    study = optuna.load_study(study_name="tune:gsap", storage=storage)
    study.sampler = optuna.samplers.TPESampler(seed=3 * 1000 + 1, n_startup_trials=5)
    dead = study.ask()
    dead.set_user_attr(WORKER_ATTR, {"host": socket.gethostname(), "pid": _gone_pid()})
    lr = dead.suggest_float("lr", *args.lr_range, log=True)
    dead.suggest_float("temperature", *args.temperature_range, log=True)
    args.n_trials = 2
    best = search(args, runner, str(RECIPE), "gsap", storage, tmp_path)
    trials = optuna.load_study(study_name="tune:gsap", storage=storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert runner.calls[1] == lr and trials[2].params == trials[1].params  # same seed, same lr
    assert best["completed"] == 2 and best["val_gap"] == max(
        t.value for t in (trials[0], trials[2])
    )


def _gone_pid():
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True)  # fmt: skip
    return int(done.stdout)
