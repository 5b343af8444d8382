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
