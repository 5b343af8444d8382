"""Command-line words: negative numbers as values, one parse (no LightningCLI args warning);
a recipe's loss section read by the loss registry's reader, the loss built once per start-up."""

import functools
import sys
import warnings

import pytest
import yaml
from cluster_helpers import RECIPE, fit_argv

from rl_gap.losses import get_loss_class
from rl_gap.training.cli import run_lightning_cli
from rl_gap.training.parser import joined_negative_values, recipe_loss_section


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


def _count_gsap_builds(monkeypatch) -> list[dict]:
    """Every GlobalSmoothAPLoss built from now on, by its keywords."""
    cls = get_loss_class("gsap")
    original = cls.__init__
    built = []

    @functools.wraps(original)  # the registry reads the keywords a loss takes from it
    def counted(self, *args, **kwargs):
        built.append(kwargs)
        original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", counted)
    return built


def test_a_fit_start_up_builds_the_loss_once(monkeypatch, tmp_path):
    built = _count_gsap_builds(monkeypatch)
    argv = ["--config", str(RECIPE), "--wandb", "off", "--output_dir", str(tmp_path)]
    cli = run_lightning_cli([*argv, "--model.loss.temperature", "0.02"], run=False)
    assert built == [{"temperature": 0.02, "neg_drop": 0.0}]  # mnist_gsap.yaml's neg_drop
    assert cli.model.loss_fn.temperature == 0.02


def test_print_config_builds_no_loss(monkeypatch, capsys):
    built = _count_gsap_builds(monkeypatch)
    with pytest.raises(SystemExit) as info:
        run_lightning_cli(["fit", "--config", str(RECIPE), "--print_config"])
    assert info.value.code == 0 and built == []
    assert "name: gsap" in capsys.readouterr().out


def test_recipe_loss_section_is_read_from_every_recipe_form(tmp_path):
    loss = {"name": "msap", "msap": {"temperature": 0.01}}
    forms = {
        "init_args.yaml": {"model": {"class_path": "M", "init_args": {"loss": loss}}},
        "plain.yaml": {"model": {"loss": loss}},
        "subcommand.yaml": {"fit": {"model": {"init_args": {"loss": loss}}}},
    }
    for name, content in forms.items():
        (tmp_path / name).write_text(yaml.safe_dump(content))
        assert recipe_loss_section(tmp_path / name) == loss, name
    (tmp_path / "none.yaml").write_text(yaml.safe_dump({"model": {"init_args": {"lr": 1}}}))
    assert recipe_loss_section(tmp_path / "none.yaml") is None
    assert recipe_loss_section(tmp_path / "missing.yaml") is None
