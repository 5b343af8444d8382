"""Command-line words: negative numbers as values, one parse (no LightningCLI args warning)."""

import sys
import warnings

import pytest
from cluster_helpers import RECIPE, fit_argv

from rl_gap.training.cli import run_lightning_cli
from rl_gap.training.parser import joined_negative_values


def test_negative_numbers_are_values():
    words = ["--model.init_args.lr", "-1e-3", "--a", "-.5", "--b=-2", "--c", "-inf", "-x"]
    assert joined_negative_values(words) == [
        "--model.init_args.lr=-1e-3", "--a=-.5", "--b=-2", "--c=-inf", "-x",
    ]  # fmt: skip
    assert joined_negative_values(["--trainer.max_epochs", "3"]) == ["--trainer.max_epochs", "3"]


def test_negative_lr_reaches_the_lr_check(capsys):
    with pytest.raises(SystemExit):
        run_lightning_cli(["--config", str(RECIPE), "--wandb", "off",
                           "--model.init_args.lr", "-1e-3"], run=False)  # fmt: skip
    err = capsys.readouterr().err
    assert "expected one argument" not in err and "lr" in err and "-0.001" in err


def test_no_args_and_command_line_warning(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["rl-gap", "fit", "--config", str(RECIPE)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_lightning_cli(["--config", str(RECIPE), "--wandb", "off"], run=False)
    assert not [w for w in caught if "not recommended to provide both" in str(w.message)]


def test_unwritable_output_dir_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(SystemExit) as info:
        run_lightning_cli(["fit", *fit_argv(blocker / "runs", "x", epochs=1, batches=1)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rl-gap: error: run folder") and "cannot be written" in err[-1]
