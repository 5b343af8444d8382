"""``--wandb auto`` follows W&B's own credential lookup; run names; plain commands' W&B runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rl_gap.cli import main
from rl_gap.training.loggers import readable_run_name, record_run_id, wandb_run_for
from rl_gap.training.wandb_mode import wandb_mode_reason
from tests.wandb_records import offline_runs, read_run

KEY = "0123456789abcdef0123456789abcdef01234567"  # the 40 hex digits of a W&B key's format
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("WANDB_API_KEY", "WANDB_MODE", "NETRC", "WANDB_IDENTITY_TOKEN_FILE",
                 "WANDB_CONFIG_DIR", "WANDB_BASE_URL"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    return home


def test_wandb_login_netrc_makes_auto_online(fake_home):
    assert wandb_mode_reason("auto")[0] == "offline"
    assert wandb_mode_reason("auto", without_credentials="off")[0] == "off"
    netrc = fake_home / ".netrc"  # what `wandb login` writes
    netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {KEY}\n")
    netrc.chmod(0o600)
    mode, why = wandb_mode_reason("auto")
    assert mode == "online" and str(netrc) in why
    # another host's entry is not W&B's
    netrc.write_text(f"machine example.org\n  login user\n  password {KEY}\n")
    assert wandb_mode_reason("auto")[0] == "offline"


def test_environment_and_wandb_mode_win(fake_home, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    assert wandb_mode_reason("auto") == ("online", "credentials from WANDB_API_KEY")
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_mode_reason("auto") == ("offline", "WANDB_MODE=offline")
    assert wandb_mode_reason("auto", without_credentials="off")[0] == "offline"
    monkeypatch.delenv("WANDB_API_KEY")
    # Lightning's WandbLogger sets WANDB_MODE=dryrun for the whole process: a plain
    # command's auto still needs credentials
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert wandb_mode_reason("auto", without_credentials="off")[0] == "off"
    assert wandb_mode_reason("auto")[0] == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode_reason("online")[0] == "off"


def test_wandb_settings_file_key(fake_home):
    # W&B reads its settings once per process: a fresh one sees the fake home's file
    settings = fake_home / ".config" / "wandb" / "settings"
    settings.parent.mkdir(parents=True)
    settings.write_text(f"[default]\napi_key = {KEY}\n")
    code = "from rl_gap.training.wandb_mode import wandb_mode_reason as r; print(r('auto'))"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120, check=True)  # fmt: skip
    assert "'online'" in out.stdout and "settings" in out.stdout
    assert out.stderr == ""  # W&B's own "Loading settings" line is not shown


def test_readable_run_name():
    changed = {"model.init_args.lr": 0.002, "model.init_args.loss.name": "msap",
               "trainer.max_epochs": 3}  # fmt: skip
    name = readable_run_name(["recipes/metric_learning/sop_gsap.yaml"], 0, changed)
    assert name == "sop_gsap seed0 loss.name=msap lr=0.002 max_epochs=3"
    assert readable_run_name(["a/b.yaml"], 1, {}, "test") == "b seed1:test"
    again = readable_run_name(["a/b.yaml"], 0, {}, folder=Path("runs/a/b/seed0-v3"))
    assert again == "b seed0 v3"
    many = {f"k{i}": i for i in range(40)}
    cut = readable_run_name(["a/b.yaml"], 0, many, limit=40)
    assert len(cut) <= 50 and cut.endswith("more")


def test_training_run_has_its_own_group_and_evaluations_join_it(tmp_path):
    fit = wandb_run_for("fit", tmp_path)
    assert fit.group == fit.id
    record_run_id(tmp_path, fit.id, fit.group)
    (tmp_path / "checkpoints").mkdir()
    ckpt = str(tmp_path / "checkpoints" / "last.ckpt")
    for sub in ("validate", "predict"):
        assert wandb_run_for(sub, tmp_path, ckpt).group == fit.id
    swept = wandb_run_for("fit", tmp_path, group="sweep1")
    assert swept.group == "sweep1"
    record_run_id(tmp_path, swept.id, swept.group)
    assert wandb_run_for("test", tmp_path, ckpt).group == "sweep1"


def test_evaluate_logs_to_its_own_offline_run(tmp_path, fake_home):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "q.npy", rng.normal(size=(12, 4)).astype(np.float32))
    (tmp_path / "ql.txt").write_text("\n".join(str(i % 3) for i in range(12)) + "\n")
    out = tmp_path / "eval" / "metrics.json"
    argv = ["evaluate", "--queries", str(tmp_path / "q.npy"), "--query-labels",
            str(tmp_path / "ql.txt"), "--output", str(out)]  # fmt: skip
    assert main([*argv, "--wandb", "offline"]) == 0
    (run_dir,) = offline_runs(tmp_path / "eval")
    run = read_run(run_dir)
    metrics = json.loads(out.read_text())
    assert run["job_type"] == "evaluate" and run["config"]["command"] == "evaluate"
    assert run["summary"]["gap"] == pytest.approx(metrics["gap"])
    # no credentials: auto logs nothing
    assert main(argv) == 0 and len(offline_runs(tmp_path)) == 1


def test_evaluate_of_a_predict_folder_joins_the_training_group(tmp_path, fake_home):
    run = tmp_path / "runs" / "sop_gsap" / "seed0"
    folder = run / "embeddings" / "test"
    folder.mkdir(parents=True)
    record_run_id(run, "abcd1234", "sweep7")
    rng = np.random.default_rng(1)
    np.save(folder / "embeddings.npy", rng.normal(size=(10, 4)).astype(np.float32))
    np.save(folder / "labels.npy", np.arange(10) % 2)
    assert main(["evaluate", "--queries", str(folder), "--wandb", "offline"]) == 0
    (run_dir,) = offline_runs(run / "wandb")
    got = read_run(run_dir)
    assert got["group"] == "sweep7" and got["job_type"] == "evaluate"
