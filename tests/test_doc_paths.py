"""The guides name files that exist: every repository path in README.md and docs/*.md.

A path is ``tests/``, ``research/``, ``benchmarks/``, ``tools/``, ``recipes/``, ``docs/``
or ``rl_gap/`` followed by a file name with one of the repository's extensions.
Paths that no longer exist (moved names) live in CHANGELOG.md, which is not a guide.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATH = re.compile(
    r"(?<![\w/.])(?:tests|research|benchmarks|tools|recipes|docs|rl_gap)/[\w/.-]*?\.(?:py|yaml|md|json|cpp|txt)\b"
)


def _mentions(text: str) -> list[tuple[int, str]]:
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        out += [(number, path) for path in PATH.findall(line) if "..." not in path]
    return out


def test_pattern_finds_paths():
    found = [p for _, p in _mentions("see `tests/losses/test_sharding.py` and docs/gpu.md.")]
    assert found == ["tests/losses/test_sharding.py", "docs/gpu.md"]


def test_every_named_path_exists():
    guides = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = [
        f"{guide.relative_to(ROOT)}:{number}: {path}"
        for guide in guides
        for number, path in _mentions(guide.read_text())
        if not (ROOT / path).exists()
    ]
    assert not missing, "guides name files that do not exist:\n" + "\n".join(missing)


def test_no_guide_sends_readers_to_the_retired_scripts_folder():
    """Studies moved to research/, benchmarks to benchmarks/, tools to tools/: a guide naming a
    ``scripts/*.py`` path points at a folder that no longer exists."""
    old = re.compile(r"(?<![\w/.])scripts/[\w/.-]+\.py\b")
    guides = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = [f"{g.relative_to(ROOT)}: {m}" for g in guides for m in old.findall(g.read_text())]
    assert not (ROOT / "scripts").exists() and not named, named
