"""The Runner's launch commands (rl_gap/experiments/runner.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_gap.experiments.runner import Runner

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "demo" / "mnist_gsap.yaml"


def _commands(monkeypatch, runner, run_dir, metrics):
    launched = []

    def launch(self, command, run_dir, fresh_logs):
        launched.append(command)
        return metrics.pop(0)

    monkeypatch.setattr(Runner, "_launch", launch)
    runner.run(RECIPE, run_dir, seed=3)
    return launched


def _flag(command, name):
    return command[command.index(name) + 1] if name in command else None


@pytest.mark.parametrize("group", ["sweepA", None])
def test_every_run_is_launched_in_the_sweep_group(monkeypatch, tmp_path, group):
    # A fresh fit names a W&B group of its own unless it is given one: the environment's
    # WANDB_RUN_GROUP alone does not reach it.
    runner = Runner(wandb="offline", group=group)
    (fit,) = _commands(monkeypatch, runner, tmp_path / "fresh", [{"val/gap": 0.5}])
    assert fit[0] == "fit" and _flag(fit, "--wandb") == "offline"
    assert _flag(fit, "--wandb_group") == group

    # a run with a checkpoint but no evaluation is validated, in the same group
    run_dir = tmp_path / "stopped"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"")
    fit, validate = _commands(monkeypatch, runner, run_dir, [{}, {"val/gap": 0.25}])
    assert _flag(fit, "--ckpt_path") == "last"
    assert validate[0] == "validate" and _flag(validate, "--wandb_group") == group
