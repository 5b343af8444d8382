"""The package's import graph has no circle and no arrow up (``tools/import_graph.py``)."""

import itertools

from tools.import_graph import main, strongly_connected


def _brute_force_cycles(graph):
    """Nodes on some cycle, grouped by mutual reachability (reference: transitive closure)."""
    nodes = sorted(set(graph) | {w for ws in graph.values() for w in ws})
    reach = {v: set(graph.get(v, ())) for v in nodes}
    changed = True
    while changed:
        changed = False
        for v, w in itertools.product(nodes, nodes):
            if w in reach[v] and not reach[w] <= reach[v]:
                reach[v] |= reach[w]
                changed = True
    groups = {frozenset(w for w in nodes if w in reach[v] and v in reach[w]) for v in nodes}
    return sorted(sorted(g) for g in groups if len(g) > 1)


def test_strongly_connected_matches_a_closure_reference():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert (
        sorted(strongly_connected(graph))
        == _brute_force_cycles(graph)
        == [
            ["a", "b", "c"],
            ["d", "e"],
        ]
    )


def test_rl_gap_has_no_import_circle_and_no_arrow_up(capsys):
    assert main([]) == 0, capsys.readouterr().out[-2000:]
    out = capsys.readouterr().out
    assert "import circles between modules: 0" in out
    assert "arrows running back up between rooms: 0" in out


def test_type_checking_imports_count(tmp_path, capsys):
    """A loop drawn only under ``if TYPE_CHECKING:`` is a circle; an import in a function is
    an arrow (hand-built package: a <-> b through a type hint, c -> cli inside a function)."""
    pkg = tmp_path / "rl_gap"
    (pkg / "losses").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "losses" / "__init__.py").write_text("")
    (pkg / "losses" / "a.py").write_text("from rl_gap.losses import b\n")
    (pkg / "losses" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rl_gap.losses.a import X\n"
    )
    (pkg / "losses" / "c.py").write_text("def f():\n    from rl_gap import cli\n")
    (pkg / "cli.py").write_text("")
    assert main(["--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "import circles between modules: 1\n  losses.a <-> losses.b\n" in out
    assert "arrows running back up between rooms: 1\n  losses.c (losses) -> cli (cli)" in out
    assert main(["--root", str(tmp_path), "--known", "losses"]) == 1  # the arrow still fails
    out = capsys.readouterr().out
    assert "import circles inside losses (known, not counted): 1" in out
