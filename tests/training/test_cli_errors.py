"""Bad input to ``rl-gap`` gives one clear error: loss name/keys at parse time (also under
--print_config), a --ckpt_path that is no checkpoint, an unknown command, an empty recipe."""

from pathlib import Path

import pytest
import torch

from rl_gap.cli import main
from rl_gap.training.cli import run_lightning_cli

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "demo" / "mnist_gsap.yaml")
MOCO_RECIPE = RECIPE.replace("mnist_gsap.yaml", "mnist_moco_gsap.yaml")
# every command the dispatcher serves, written out (not read from the code under test)
ALL_COMMANDS = ["fit", "validate", "test", "predict", "evaluate", "extrapolate", "knn",
                "linear-probe"]  # fmt: skip


def _error_lines(err):
    return [line for line in err.splitlines() if "error:" in line]


@pytest.mark.parametrize(
    "override, named",
    [
        (["--model.loss.temprature", "0.1"], ["'temprature'", "'temperature'", "'neg_drop'"]),
        (["--model.loss.name", "gsp"], ["'gsp'", "gsap", "infonce", "msap", "siglip"]),
        (["--model.init_args.loss", "{name: infonce, tau: 0.1}"], ["'tau'", "'temperature'"]),
    ],
)
def test_loss_section_is_checked_while_parsing(capsys, override, named):
    # --print_config parses but builds nothing: the check must not wait for the model
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", "--config", RECIPE, *override, "--print_config"])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert "trainer:" not in out, "the config must not be printed"
    (line,) = _error_lines(err)
    assert "--model.loss" in line and all(word in line for word in named), line


def test_valid_loss_swap_still_parses(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(
            ["fit", "--config", RECIPE, "--model.loss.name", "msap", "--print_config"]
        )
    assert exit_info.value.code == 0
    assert "name: msap" in capsys.readouterr().out


def test_ckpt_path_that_is_not_a_checkpoint(tmp_path, capsys):
    text = tmp_path / "notackpt.txt"
    text.write_text("hello\n")
    plain = tmp_path / "plain.pt"
    torch.save({"weights": torch.zeros(2)}, plain)
    cases = [
        (text, "is not a checkpoint: torch.load failed"),
        (plain, "is not a Lightning checkpoint (no 'state_dict'"),
        (tmp_path / "missing.ckpt", "does not exist"),
    ]
    for path, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            run_lightning_cli(
                ["fit", "--config", RECIPE, "--wandb", "off", "--ckpt_path", str(path)]
            )
        assert exit_info.value.code == 2
        (line,) = _error_lines(capsys.readouterr().err)
        assert str(path) in line and message in line, line


def test_unknown_command_lists_every_command(capsys):
    assert main(["nosuchcmd"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'nosuchcmd'" in err
    for name in ALL_COMMANDS:
        assert f"  {name} " in err, name


@pytest.mark.parametrize(
    "content, message", [("", "is empty"), ("# only a comment\n", "is empty"), ("- 1\n", "list")]
)
def test_empty_or_non_mapping_config_file(tmp_path, capsys, content, message):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(content)
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", "--config", str(recipe)])
    assert exit_info.value.code == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert str(recipe) in line and message in line, line


@pytest.mark.parametrize(
    "recipe, override, message",
    [
        (RECIPE, ["--model.loss.gsap.temperature", "0"],
         "--model.loss: temperature must be a finite number > 0"),
        (RECIPE, ["--model.init_args.betas", "[0.9, 1.0]"],
         "--model.init_args: betas must lie in [0, 1)"),
        # the module's own check, which jsonargparse reports inside a multi-line Union error
        (MOCO_RECIPE, ["--model.init_args.momentum", "1.5"],
         "--model.init_args: momentum must lie in [0, 1], got 1.5"),
    ],
)  # fmt: skip
def test_a_bad_value_is_one_line_when_the_module_is_built(
    tmp_path, capsys, recipe, override, message
):
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", "--config", recipe, "--output_dir", str(tmp_path / "runs"),
                           "--wandb", "off", *override])  # fmt: skip
    assert exit_info.value.code == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert line.startswith("rl-gap: error: ") and message in line, line
    assert not (tmp_path / "runs").exists()  # refused before the run folder is made
