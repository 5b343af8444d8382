"""``rl-gap fit|validate|test|predict --help`` replayed from a recorded spec: equal to the live
LightningCLI help at any width, never used once any input of the text has changed."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_gap import help_spec
from rl_gap.cli import build_parser, main
from rl_gap.commands import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
STALE_PAGE = {
    "prog": "{prog} fit",
    "usage": "a page from a stale spec",
    "description": None,
    "epilog": None,
    "indent_increment": 2,
    "max_help_position": 24,
    "usage_actions": [],
    "groups": [],
    "actions": [],
}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A stale spec, then ``rl-gap fit --help``: what it printed, the spec it wrote, its parser."""
    spec_file = tmp_path_factory.mktemp("spec") / "help_spec.json"
    spec_file.write_text(
        json.dumps({"format": 1, "key": "0" * 64, "commands": {"fit": STALE_PAGE}})
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RL_GAP_HELP_SPEC", str(spec_file))
        mp.setenv("COLUMNS", "80")
        mp.delenv("RL_GAP_HELP_CACHE", raising=False)
        mp.setattr(sys, "argv", ["rl-gap"])
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
            main(["fit", "--help"])
        assert stop.value.code == 0
        key = help_spec.current_key()
    return {
        "printed": out.getvalue(),
        "spec": json.loads(spec_file.read_text()),
        "file": spec_file,
        "parser": help_spec.last_recording["parser"],
        "key": key,
    }


def test_a_stale_spec_is_detected_and_rewritten(live):
    assert "a page from a stale spec" not in live["printed"]
    assert live["printed"].startswith("usage: rl-gap [options] fit [-c CONFIG]")
    assert "--trainer.max_epochs MAX_EPOCHS" in live["printed"]
    assert live["spec"]["key"] == live["key"] != "0" * 64
    assert sorted(live["spec"]["commands"]) == sorted([*help_spec.COMMANDS, *COMMANDS])
    assert help_spec.render(live["spec"]["commands"]["fit"], "rl-gap") == live["printed"]


@pytest.mark.parametrize("columns", [40, 57, 80, 143])
@pytest.mark.parametrize("command", help_spec.COMMANDS)
def test_replay_equals_the_live_help_at_every_width(live, monkeypatch, command, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    parser = live["parser"]._subcommands_action._name_parser_map[command]
    expected = parser.format_help()  # LightningCLI's own text, wrapped to this width
    assert help_spec.render(live["spec"]["commands"][command], "rl-gap") == expected


@pytest.mark.parametrize("columns", [40, 80, 143])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_plain_commands_replay_their_argparse_help(live, monkeypatch, command, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    assert (
        help_spec.render(live["spec"]["commands"][command])
        == build_parser(command)[0].format_help()
    )


def test_a_fresh_process_replays_the_help_without_torch_or_lightning(live):
    code = (
        "import json, sys\n"
        "sys.argv[0] = 'rl-gap'\n"
        "from rl_gap.cli import main\n"
        "for command in ('fit', 'extrapolate'):\n"
        "    try:\n"
        "        main([command, '--help'])\n"
        "    except SystemExit as stop:\n"
        "        assert stop.code == 0\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = {**os.environ, "RL_GAP_HELP_SPEC": str(live["file"]), "COLUMNS": "80"}
    env.update(PYTHONPATH=str(ROOT))
    env.pop("RL_GAP_HELP_CACHE", None)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed, _, modules = proc.stdout.rpartition("\n[")
    extrapolate = build_parser("extrapolate")[0].format_help()
    assert printed + "\n" == live["printed"] + extrapolate
    loaded = {name.split(".")[0] for name in json.loads("[" + modules)}
    assert loaded & {"torch", "lightning", "jsonargparse", "numpy"} == set()


def test_the_key_follows_sources_distributions_environment_and_python(tmp_path, monkeypatch):
    package = tmp_path / "package"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "module.py").write_text("x = 1\n")
    site = tmp_path / "site"
    (site / "foo-1.0.dist-info").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(site))
    for name in [k for k in os.environ if k.startswith(help_spec.ENV_PREFIXES)]:
        monkeypatch.delenv(name)
    keys = [help_spec.current_key(package)]
    assert help_spec.current_key(package) == keys[0]

    def changed() -> None:
        keys.append(help_spec.current_key(package))
        assert keys[-1] != keys[-2]

    (package / "sub" / "module.py").write_text("x = 2\n")  # an edited source, same size
    changed()
    (package / "new.yaml").write_text("a: 1\n")  # a new file (a recipe)
    changed()
    (site / "foo-1.0.dist-info").rename(site / "foo-1.1.dist-info")  # an upgrade
    changed()
    (site / "bar-0.1.dist-info").mkdir()  # an install (an optional dependency)
    changed()
    (site / "rl_gap.egg-info").mkdir()  # a source checkout's build metadata: no input
    assert help_spec.current_key(package) == keys[-1]
    monkeypatch.setenv("JSONARGPARSE_DEFAULT_ENV", "true")  # options read from the environment
    changed()
    monkeypatch.setattr(sys, "version", sys.version + " (another build)")
    changed()
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "module.cpython.pyc").write_bytes(b"\0")
    assert help_spec.current_key(package) == keys[-1]  # bytecode is no input


def test_replay_is_off_with_the_cache_switch(monkeypatch, tmp_path, capsys):
    spec_file = tmp_path / "help_spec.json"
    spec_file.write_text(
        json.dumps({"key": help_spec.current_key(), "commands": {"fit": STALE_PAGE}})
    )
    monkeypatch.setenv("RL_GAP_HELP_SPEC", str(spec_file))
    monkeypatch.delenv("RL_GAP_HELP_CACHE", raising=False)
    assert help_spec.print_help("fit")
    assert "a page from a stale spec" in capsys.readouterr().out
    monkeypatch.setenv("RL_GAP_HELP_CACHE", "0")
    assert not help_spec.print_help("fit")
    assert not help_spec.print_help("validate")
