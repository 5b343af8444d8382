"""Runs that survive faults: SIGTERM and step checkpoints resume exactly, per-config run folders,
a resume of another configuration is refused, an unwritable checkpoint folder fails before step 1,
and W&B gets the resolved config and one stable id (offline)."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from cluster_helpers import assert_same_weights, weights
from lightning.pytorch.callbacks import Callback

from rl_gap.training.cli import run_lightning_cli
from rl_gap.training.run_config import ResumeMismatchError

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "demo" / "mnist_gsap.yaml"
EPOCHS, BATCHES = 2, 4  # SIGTERM after step 6 = mid-way through the second epoch


def _argv(out, name, *extra, epochs=EPOCHS, batches=BATCHES):
    argv = [
        "--config", str(RECIPE), "--output_dir", str(out), "--wandb", "off",
        "--trainer.max_epochs", str(epochs), "--trainer.limit_train_batches", str(batches),
        "--trainer.limit_val_batches", "1", "--trainer.check_val_every_n_epoch", str(epochs),
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--data.init_args.eval_batch_size", "100", "--model.init_args.eval_plots", "false",
        "--model.init_args.backbone_kwargs", "{width: 8}", *extra,
    ]  # fmt: skip
    if name:
        argv += ["--run_name", name]
    return argv


class CountSteps(Callback):
    def __init__(self) -> None:
        self.steps = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.steps += 1


class CrashAtStep(Callback):
    """A crash (not a signal) before optimizer step ``step + 1``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("simulated crash")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Final weights of the uninterrupted 2-epoch x 4-batch run."""
    cli = run_lightning_cli(["fit", *_argv(tmp_path_factory.mktemp("full"), "full")])
    assert cli.trainer.global_step == EPOCHS * BATCHES
    return weights(cli)


def _resume_and_check(out, name, uninterrupted):
    resumed = run_lightning_cli(["fit", *_argv(out, name, "--ckpt_path", "last")])
    assert resumed.trainer.global_step == EPOCHS * BATCHES
    assert_same_weights(weights(resumed), uninterrupted)


def test_sigterm_mid_epoch_saves_exits_143_and_resumes_exactly(run_dir, uninterrupted, capsys):
    # a real SIGTERM delivered to this process after step 6 (epoch 1, batch 1)
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(
            ["fit", *_argv(run_dir, "cut", "--trainer.callbacks+=fault_helpers.SigtermAtStep",
                           "--trainer.callbacks.step=6")]
        )  # fmt: skip
    assert exit_info.value.code == 143
    last = run_dir / "cut" / "checkpoints" / "last.ckpt"
    assert "SIGTERM" in capsys.readouterr().err
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 6 and ckpt["epoch"] == 1  # mid-epoch, no validation ran
    _resume_and_check(run_dir, "cut", uninterrupted)


@pytest.mark.slow
def test_sigterm_from_another_process(run_dir, uninterrupted):
    """``rl-gap fit`` as a subprocess receives SIGTERM mid-epoch from this test."""
    marker = run_dir / "paused"
    pause = {
        "class_path": "fault_helpers.PauseAtStep",
        "init_args": {"step": 6, "marker": str(marker)},
    }
    cmd = [sys.executable, "-m", "rl_gap.cli", "fit", *_argv(run_dir, "killed"),
           f"--trainer.callbacks+={json.dumps(pause)}"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists(), f"training never reached step 6: {proc.communicate()[1][-2000:]}"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-2000:]
    last = run_dir / "killed" / "checkpoints" / "last.ckpt"
    assert str(last) in err
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 6
    _resume_and_check(run_dir, "killed", uninterrupted)


def test_step_checkpoint_without_validation_resumes_exactly(run_dir):
    def build(name, *extra):
        argv = _argv(run_dir, name, "--checkpoint_every_n_steps", "3", *extra, epochs=1, batches=6)
        return run_lightning_cli(argv, run=False)

    full = build("steps_full")
    full.trainer.fit(full.model, full.datamodule)
    crashed = build("steps")
    crashed.trainer.callbacks.append(CrashAtStep(5))
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashed.trainer.fit(crashed.model, crashed.datamodule)
    last = run_dir / "steps" / "checkpoints" / "last.ckpt"
    # no validation and no epoch end happened: only the every-3-steps checkpoint exists
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 3
    resumed = build("steps")
    counter = CountSteps()
    resumed.trainer.callbacks.append(counter)
    resumed.trainer.fit(resumed.model, resumed.datamodule, ckpt_path="last")
    assert counter.steps == 3, "resume continues at batch 3 of the epoch"
    assert_same_weights(weights(resumed), weights(full))


def _hash(overrides):
    """The documented rule: first 8 hex digits of sha1(sorted JSON of the changed keys)."""
    return hashlib.sha1(json.dumps(overrides, sort_keys=True).encode()).hexdigest()[:8]


@pytest.mark.parametrize(
    "extra, folder",
    [
        ([], "seed0"),
        (["--trainer.devices", "1", "--wandb", "offline"], "seed0"),  # not training keys
        (["--model.loss.name", "gsap"], "seed0"),  # the recipe's own value
        (["--seed_everything", "3"], "seed3"),
        (["--model.loss.name", "msap"], "seed0-" + _hash({"model.init_args.loss.name": "msap"})),
        (
            ["--seed_everything", "1", "--model.init_args.lr", "0.01", "--trainer.max_epochs", "9"],
            "seed1-" + _hash({"model.init_args.lr": 0.01, "trainer.max_epochs": 9}),
        ),
    ],
)
def test_each_override_combination_and_seed_gets_its_own_run_folder(tmp_path, extra, folder):
    argv = ["--config", str(RECIPE), "--output_dir", str(tmp_path), "--wandb", "off", *extra]
    cli = run_lightning_cli(argv, run=False)
    assert Path(cli.trainer.default_root_dir) == tmp_path / "demo" / "mnist_gsap" / folder


def test_dataset_location_does_not_change_the_run_folder(tmp_path):
    recipe = ROOT / "recipes" / "metric_learning" / "sop_gsap.yaml"
    cpu = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto",
           "--trainer.precision", "32", "--model.init_args.backbone", "rl_gap_convnet"]  # fmt: skip
    folders = set()
    for root in ([], ["--data.init_args.root", "/mnt/elsewhere/sop"]):
        argv = ["--config", str(recipe), "--output_dir", str(tmp_path), "--wandb", "off", *cpu]
        folders.add(run_lightning_cli([*argv, *root], run=False).trainer.default_root_dir)
    assert folders == {str(tmp_path / "metric_learning" / "sop_gsap" / ("seed0-" + _hash(
        {"model.init_args.backbone": "rl_gap_convnet", "trainer.precision": 32})))}  # fmt: skip


def test_resume_of_another_configuration_is_refused_unless_forced(run_dir, capsys):
    first = run_lightning_cli(["fit", *_argv(run_dir, "shared", epochs=1, batches=2)])
    assert first.trainer.global_step == 2
    other = ["fit", *_argv(run_dir, "shared", "--model.loss.name", "msap", "--ckpt_path", "last",
                           epochs=1, batches=2)]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(other)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "refusing to resume" in err and "last.ckpt" in err
    assert 'model.init_args.loss.name: checkpoint "gsap", now "msap"' in err
    assert "--force_resume" in err
    # the Lightning-level check (hpc checkpoints, trainer.fit from Python) refuses too
    cli = run_lightning_cli(_argv(run_dir, "shared", "--model.loss.name", "msap", epochs=1,
                                  batches=2), run=False)  # fmt: skip
    with pytest.raises(ResumeMismatchError, match="model.init_args.loss.name"):
        cli.trainer.fit(cli.model, cli.datamodule, ckpt_path="last")
    with pytest.warns(UserWarning, match="model.init_args.loss.name"):
        forced = run_lightning_cli([*other, "--force_resume", "true"])
    assert forced.trainer.global_step == 2  # restored (training was already complete)


def test_unwritable_checkpoint_folder_fails_before_the_first_step(run_dir):
    cli = run_lightning_cli(_argv(run_dir, "blocked", epochs=1, batches=2), run=False)
    folder = run_dir / "blocked" / "checkpoints"
    folder.parent.mkdir(parents=True, exist_ok=True)  # the run folder holds the run lock
    folder.write_text("a file where the checkpoint folder should be")
    counter = CountSteps()
    cli.trainer.callbacks.append(counter)
    with pytest.raises(PermissionError, match=f"checkpoint folder {folder} cannot be written"):
        cli.trainer.fit(cli.model, cli.datamodule)
    assert counter.steps == 0


def test_wandb_resolved_config_stable_id_and_options(run_dir):
    argv = _argv(run_dir, "wb", epochs=1, batches=1)
    argv[argv.index("--wandb") + 1] = "offline"
    options = ["--wandb_tags", "[demo, gsap]", "--wandb_group", "g1", "--wandb_entity", "me"]
    cli = run_lightning_cli([*argv, *options], run=False)
    run_id = (run_dir / "wb" / "wandb_id").read_text().strip()
    experiment = cli.trainer.loggers[1].experiment
    try:
        assert experiment.id == run_id
        assert tuple(experiment.tags) == ("demo", "gsap") and experiment.group == "g1"
        config = dict(experiment.config)
        recipe = yaml.safe_load(RECIPE.read_text())
        # the whole resolved config: recipe values, overrides, defaults of unset keys
        assert (
            config["model.init_args.loss.gsap.temperature"]
            == recipe["model"]["init_args"]["loss"]["gsap"]["temperature"]
        )
        assert config["data.init_args.m_per_class"] == recipe["data"]["init_args"]["m_per_class"]
        assert config["trainer.max_epochs"] == 1 and config["wandb_group"] == "g1"
        assert config["trainer.min_epochs"] is None
    finally:
        experiment.finish()
    # train (a fresh fit: a W&B run of its own), then resume: the checkpoint carries the
    # fit's id and the resumed W&B run continues it
    fitted = run_lightning_cli(["fit", *argv])
    fit_id = (run_dir / "wb" / "wandb_id").read_text().strip()
    assert fit_id != run_id
    ckpt = torch.load(run_dir / "wb" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["rl_gap"]["wandb_id"] == fit_id
    assert fitted.trainer.global_step == 1
    run_lightning_cli(["fit", *argv, "--ckpt_path", "last"])
    runs = sorted((run_dir / "wb" / "wandb").glob("offline-run-*"))
    # wandb appends "-1" to the folder of a second run started in the same second
    same_id = re.compile(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(fit_id)}(-\d+)?")
    assert len(runs) == 3 and sum(bool(same_id.fullmatch(r.name)) for r in runs) == 2, runs
