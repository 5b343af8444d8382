"""``--help`` from the cache: a hit prints the stored text; any input of the text changes the key."""

from __future__ import annotations

import os

import pytest

from rl_gap.cli import main
from rl_gap.help_spec.pages import cache_dir, help_key


@pytest.fixture
def help_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RL_GAP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RL_GAP_HELP_CACHE", raising=False)
    return tmp_path / "cache" / "help"


def _help(words, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(words)
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_second_help_is_printed_from_the_cache(help_cache, capsys):
    first = _help(["knn", "--help"], capsys)
    assert "rl-gap knn" in first and "--checkpoint" in first
    (stored,) = help_cache.glob("*.txt")
    assert stored.read_text() == first
    stored.write_text("from the cache\n")  # a hit prints the file, it does not rebuild
    assert _help(["knn", "--help"], capsys) == "from the cache\n"


def test_failed_commands_are_not_cached(help_cache, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["knn", "--k", "--help"])  # --k needs a value: argparse fails before the help
    assert stop.value.code == 2
    assert list(help_cache.glob("*.txt")) == []


def test_key_follows_named_files_sources_and_width(tmp_path, monkeypatch):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("seed_everything: 0\n")
    words = ["fit", "--config", str(recipe), "--help"]
    key = help_key(words)
    assert help_key(words) == key
    assert help_key(["fit", f"--config={recipe}", "--help"]) != key
    stat = recipe.stat()
    os.utime(recipe, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert help_key(words) != key  # an edited recipe
    key = help_key(words)
    monkeypatch.setenv("COLUMNS", "57")
    assert help_key(words) != key  # argparse wraps to the terminal width


def test_switch_off_and_location(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RL_GAP_CACHE", str(tmp_path))
    monkeypatch.setenv("RL_GAP_HELP_CACHE", "0")
    assert cache_dir() == tmp_path / "help"
    _help(["knn", "--help"], capsys)
    assert not (tmp_path / "help").exists()
