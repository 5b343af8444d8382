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
