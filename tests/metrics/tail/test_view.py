"""The maths read a prediction through ``view.TailView``: none of them imports the predictor."""

from __future__ import annotations

import ast
from pathlib import Path

import rl_gap.metrics.tail as tail
from rl_gap.metrics.tail.predictor import TailPredictor
from rl_gap.metrics.tail.view import TailView

PACKAGE = Path(tail.__file__).parent
#: The modules above the predictor: they build it, or call it for users.
ABOVE = {"__init__", "build", "from_scores", "metric", "plot", "predictor"}


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports, ``if TYPE_CHECKING:`` and function-level imports included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_no_module_below_the_predictor_imports_it():
    below = [p for p in sorted(PACKAGE.glob("*.py")) if p.stem not in ABOVE]
    assert len(below) >= 15
    offenders = [p.name for p in below if "rl_gap.metrics.tail.predictor" in _imported(p)]
    assert offenders == []


def test_the_view_stands_on_the_ground_floor():
    """view.py names only the settings types of the package (under TYPE_CHECKING)."""
    own = {m for m in _imported(PACKAGE / "view.py") if m.startswith("rl_gap.")}
    assert own <= {
        "rl_gap.metrics.tail.bayes",
        "rl_gap.metrics.tail.bayes.BayesTailConfig",
        "rl_gap.metrics.tail.bayes.GPDPosterior",
        "rl_gap.metrics.tail.hardness",
        "rl_gap.metrics.tail.hardness.TailConfig",
    }


def test_the_predictor_has_every_member_of_the_view():
    members = {
        name
        for cls in TailView.__mro__
        if cls.__module__ == "rl_gap.metrics.tail.view"
        for name in (*vars(cls), *getattr(cls, "__annotations__", {}))
        if not name.startswith("_")
    }
    assert {"hardness", "level", "level_rows", "memo", "pos_sorted", "fractions"} <= members
    missing = [name for name in members if not hasattr(TailPredictor, name)]
    # Data attributes are set per instance.
    assert sorted(missing) == sorted(
        ["pos_sorted", "valid", "j", "query_ok", "k", "config", "bayes", "sample_size", "seed"]
    )
