"""Where native helpers are cached, and which files decide whether a helper is rebuilt."""

from pathlib import Path

from rl_gap.native_build import cache_dir, local_includes


def test_cache_dir_follows_rl_gap_cache_then_an_absolute_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("RL_GAP_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("RL_GAP_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "rl_gap"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # ignored, as the XDG spec says
    assert cache_dir() == Path.home() / ".cache" / "rl_gap"


def test_local_includes_are_followed_transitively_once_and_system_headers_skipped(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "main.cpp").write_text('#include <vector>\n#include "a.h"\n  # include "sub/b.h"\n')
    (tmp_path / "a.h").write_text('#include "sub/b.h"\n')
    (tmp_path / "sub" / "b.h").write_text('#include "c.h"\n')  # relative to sub/
    (tmp_path / "sub" / "c.h").write_text("")
    got = local_includes(tmp_path / "main.cpp")
    assert got == [tmp_path / "main.cpp", tmp_path / "a.h", tmp_path / "sub" / "b.h",
                   tmp_path / "sub" / "c.h"]  # fmt: skip
