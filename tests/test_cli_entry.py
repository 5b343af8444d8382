"""The ``rl-gap`` dispatcher: top-level help lists every command; each sub-command loads."""

import importlib

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
