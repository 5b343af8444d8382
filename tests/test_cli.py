"""The ``rl-gap`` dispatcher: top-level help lists every command; each sub-command loads."""

import importlib
import sys

import numpy as np
import pytest

from rl_gap.cli import TRAINING_COMMANDS, main
from rl_gap.commands import COMMANDS


def test_help_lists_training_and_plain_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in [*TRAINING_COMMANDS, *COMMANDS]:
        assert f"  {name} " in out


def test_no_arguments_prints_usage_and_fails(capsys):
    assert main([]) == 2
    assert "usage: rl-gap COMMAND" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_registered_command_module_has_the_protocol(name):
    module = importlib.import_module(COMMANDS[name][0])
    assert callable(module.add_arguments) and callable(module.run)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_help_exits_cleanly(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    assert f"rl-gap {name}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "words, message",
    [
        (["evaluate", "--queries", "{tmp}/missing.npy", "--query-labels", "{tmp}/l.npy"],
         "missing file"),
        (["evaluate", "--queries", "{tmp}/e.npy", "--query-labels", "{tmp}/nan.npy"],
         "query labels must be integer class ids, got nan"),
        (["extrapolate", "--queries", "{tmp}/e.npy", "--positives", "{tmp}/e.npy",
          "--distractors", "{tmp}/e.npy", "--gallery-size", "100", "--k", "0"],
         "--k must be >= 1"),
        (["extrapolate", "--queries", "{tmp}/e.npy", "--positives", "{tmp}/e.npy",
          "--distractors", "{tmp}/e.npy", "--gallery-size", "100", "--query-labels",
          "{tmp}/l.npy", "--positive-labels", "{tmp}/l.npy"],
         "is the --queries set"),
    ],
)  # fmt: skip
def test_console_input_errors_are_one_line_with_exit_2(tmp_path, monkeypatch, capsys, words,
                                                       message):  # fmt: skip
    """The console command (main() reading sys.argv) reports a bad input as fit does: one
    line on stderr, exit status 2, no traceback; main(argv) from Python still raises."""
    np.save(tmp_path / "e.npy", np.eye(4, dtype=np.float32))
    np.save(tmp_path / "l.npy", np.array([0, 0, 1, 1]))
    np.save(tmp_path / "nan.npy", np.array([0.0, 0.0, 1.0, np.nan]))
    argv = [w.format(tmp=tmp_path) for w in words]
    monkeypatch.setattr(sys, "argv", ["rl-gap", *argv])
    assert main() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"rl-gap {argv[0]}: error: ") and message in err[-1]
    assert not any("Traceback" in line for line in err)
    with pytest.raises((ValueError, OSError), match=message.replace("(", r"\(")):
        main(argv)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_with_a_default_shows_it_in_help(name):
    from rl_gap.cli import build_parser

    parser, _ = build_parser(name)
    for action in parser._actions:
        if action.option_strings and action.nargs != 0 and action.default is not None:
            assert "default" in (action.help or "").lower(), (name, action.option_strings)


def test_knn_help_states_the_temperature_default(capsys, monkeypatch):
    monkeypatch.setenv("RL_GAP_HELP_CACHE", "0")
    with pytest.raises(SystemExit):
        main(["knn", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "vote weight exp(s/T) (default: 0.07)" in text


def test_quiet_on_a_training_command_turns_the_trainer_bar_off(monkeypatch):
    import rl_gap.cli as cli
    import rl_gap.training.early_checks as early_checks

    seen, checked = [], []
    monkeypatch.setattr(cli, "run_training_command", lambda argv: seen.append(argv) or 0)
    # the early checks (files exist, keys known) see the words the trainer will get
    monkeypatch.setattr(early_checks, "early_error", lambda words: checked.append(words))
    words = ["predict", "--config", "r.yaml", "--quiet", "--ckpt_path", "x.ckpt"]
    assert cli.main(words) == 0
    assert seen[-1] == ["predict", "--config", "r.yaml", "--ckpt_path", "x.ckpt",
                        "--trainer.enable_progress_bar", "false"]  # fmt: skip
    assert checked[-1] == seen[-1]
    # the console script: LightningCLI reads sys.argv, so that is where the words change
    monkeypatch.setattr(sys, "argv", ["rl-gap", *words])
    assert cli.main() == 0
    assert seen[-1] is None and sys.argv[1:] == cli.quiet_training_words(words)
