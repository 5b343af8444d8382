"""Every import of ours in ``research/``, ``benchmarks/`` and ``tools/`` resolves.

Scripts are run by hand, not by the suite, so an import left behind by a move (one inside a
worker function especially) breaks only when someone next runs the script. This test reads
each file with ``ast`` (imports inside functions included) and checks that each imported
module imports and that each imported name exists, as an attribute or as a submodule.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("research", "benchmarks", "tools")
PACKAGES = ("rl_gap", *FOLDERS)
FILES = sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def _ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def collect_imports(source: str) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` for each import of ours; ``name`` is None for ``import a.b``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if _ours(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _ours(node.module or ""):
            found += [(node.lineno, node.module, a.name) for a in node.names]
    return sorted(found)


def unresolved(module: str, name: str | None) -> str | None:
    """Why ``from module import name`` (or ``import module``) would fail; None if it works."""
    try:
        mod = importlib.import_module(module)
    except ImportError as err:
        return f"module {module} does not import ({err})"
    if name is None or name == "*" or hasattr(mod, name):
        return None
    try:
        importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError:
        return f"{module} has no name or submodule {name!r}"
    return None


def test_collect_imports_finds_nested_imports_and_only_ours():
    source = (
        "import os\n"
        "import rl_gap.losses as L\n"
        "from research.tail_family import WORLDS, world_name\n"
        "from . import sibling\n"
        "def worker():\n"
        "    from rl_gap import dist\n"
        "    class K:\n"
        "        def f(self):\n"
        "            import numpy, research.tail_split\n"
    )
    assert collect_imports(source) == [
        (2, "rl_gap.losses", None),
        (3, "research.tail_family", "WORLDS"),
        (3, "research.tail_family", "world_name"),
        (6, "rl_gap", "dist"),
        (9, "research.tail_split", None),
    ]


def test_unresolved_tells_a_stale_import_from_a_live_one():
    assert unresolved("rl_gap", "dist") is None  # a submodule
    assert unresolved("rl_gap.losses", "build_loss") is None  # an attribute
    assert unresolved("rl_gap.losses", "dist") == "rl_gap.losses has no name or submodule 'dist'"
    assert unresolved("rl_gap.no_such_module", None).startswith("module rl_gap.no_such_module")


def test_the_scanned_folders_hold_files():
    names = {p.relative_to(ROOT).as_posix() for p in FILES}
    assert {
        "benchmarks/bench_sharded_loss.py",
        "research/tail_study.py",
        "tools/import_graph.py",
    } <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_imports_of_the_lab_benchmarks_and_tools_resolve(path):
    rel = path.relative_to(ROOT).as_posix()
    problems = [
        f"{rel}:{line}: {why}"
        for line, module, name in collect_imports(path.read_text())
        if (why := unresolved(module, name))
    ]
    assert not problems, "\n".join(problems)
