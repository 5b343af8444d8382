"""The sweep grid: every setting x seed trained once into its own folder, reported on the test
split, and the shared options checked before anything runs."""

import argparse
import types
from pathlib import Path

import pytest

from rl_gap.experiments.grid import (
    Setting,
    add_grid_arguments,
    on_test_split,
    run_grid,
    runner_from_args,
)

ROOT = Path(__file__).resolve().parents[2]


def test_run_grid_trains_each_setting_with_each_seed_in_its_own_folder(tmp_path):
    calls = []

    def run(recipe, run_dir, seed, overrides):
        calls.append((recipe, run_dir, seed, overrides))
        return {"val/gap": 0.5 + seed / 10}

    settings = [Setting({"loss": "gsap"}, "a.yaml", ("--x", "1"), "gsap"),
                Setting({"loss": "msap"}, "b.yaml", (), "msap")]  # fmt: skip
    rows = run_grid(types.SimpleNamespace(run=run), settings, tmp_path, seeds=[0, 1])
    assert [(c[0], c[1], c[2], c[3]) for c in calls] == [
        ("a.yaml", tmp_path / "gsap" / "seed_0", 0, ["--x", "1"]),
        ("a.yaml", tmp_path / "gsap" / "seed_1", 1, ["--x", "1"]),
        ("b.yaml", tmp_path / "msap" / "seed_0", 0, []),
        ("b.yaml", tmp_path / "msap" / "seed_1", 1, []),
    ]
    assert [(r["loss"], r["seed"], r["gAP"]) for r in rows] == [
        ("gsap", 0, 0.5), ("gsap", 1, 0.6), ("msap", 0, 0.5), ("msap", 1, 0.6)]  # fmt: skip


def test_a_recipe_with_a_validation_split_is_reported_on_the_test_split():
    with_split = next(
        p for p in sorted(ROOT.glob("recipes/*/*.yaml")) if "val_split" in p.read_text()
    )
    assert on_test_split(str(with_split)) == ("--data.init_args.val_split", "0")


def _args(*argv):
    parser = argparse.ArgumentParser()
    add_grid_arguments(parser, ["a.yaml"])
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num-seeds", "0"], "--num-seeds must be >= 1"),
        (["--overrides", "--data.init_args.val_split 0.3"], "reports the test split"),
    ],
)
def test_grid_options_are_checked_before_any_run(argv, message):
    with pytest.raises(ValueError, match=message):
        runner_from_args(_args(*argv), group="g")


def test_grid_options_build_the_runner():
    runner = runner_from_args(
        _args("--trial-command", "torchrun --nproc_per_node 2 -m rl_gap.cli", "--overrides",
              "--trainer.max_epochs 2 --model.init_args.lr 1e-4", "--wandb", "off"),
        group="g",
    )  # fmt: skip
    assert runner.command == ["torchrun", "--nproc_per_node", "2", "-m", "rl_gap.cli"]
    assert runner.overrides == ["--trainer.max_epochs", "2", "--model.init_args.lr", "1e-4"]
    assert (runner.wandb, runner.group) == ("off", "g")
    default = runner_from_args(_args(), group="h")
    assert (default.command, default.overrides, default.wandb) == (None, [], "auto")
