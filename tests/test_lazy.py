"""Package faces load names on first use; light imports stay light (checked in a fresh process)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FACES = [
    "rl_gap.models",
    "rl_gap.modules",
    "rl_gap.metrics",
    "rl_gap.metrics.tail",
    "rl_gap.callbacks",
]
HEAVY = [
    "lightning",
    "torchmetrics",
    "torchvision",
    "torch._dynamo",
    "scipy.signal",
    "timm",
    "open_clip",
]


def _modules_after(statement: str) -> list[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_losses_faces_and_extrapolate_import_no_heavy_library():
    """``import rl_gap.losses`` costs torch and no more; the faces and ``rl-gap extrapolate``'s
    module import none of Lightning, torchmetrics, torchvision, dynamo, scipy.signal, timm, open_clip."""
    loaded = set(_modules_after(
        "import rl_gap.losses, rl_gap.commands.extrapolate, rl_gap.cli\n"
        + "\n".join(f"import {face}" for face in FACES)
    ))  # fmt: skip
    assert "torch" in loaded  # the check itself is live: a real import happened
    assert sorted(loaded & set(HEAVY)) == []


@pytest.mark.parametrize("face", FACES)
def test_every_public_name_of_a_face_resolves_to_its_submodule_object(face):
    package = importlib.import_module(face)
    assert package.__all__, face
    for name in package.__all__:
        value = getattr(package, name)
        origin = getattr(value, "__module__", None)
        if origin is not None and origin.startswith("rl_gap."):
            assert getattr(importlib.import_module(origin), name, value) is value
        assert name in dir(package)
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        package.NoSuchName  # noqa: B018


def test_recipe_class_paths_through_the_faces_resolve():
    from rl_gap.callbacks import ModelSelectionGuard
    from rl_gap.callbacks.selection import ModelSelectionGuard as direct
    from rl_gap.modules import MetricLearningModule
    from rl_gap.modules.metric_learning import MetricLearningModule as direct_module

    assert ModelSelectionGuard is direct and MetricLearningModule is direct_module


def test_by_module_inverts_the_groups_and_refuses_a_name_twice():
    from rl_gap.lazy import by_module

    assert by_module({".a": ("X", "Y"), ".b": ("Z",)}) == {"X": ".a", "Y": ".a", "Z": ".b"}
    with pytest.raises(ValueError, match="'X' is exported from both .a and .b"):
        by_module({".a": ("X",), ".b": ("X",)})


def test_each_package_face_exports_what_its_type_checking_block_names():
    """__all__ is built from the export table; the TYPE_CHECKING imports name the same set."""
    import ast
    import importlib
    from pathlib import Path

    for package in ("callbacks", "metrics", "models", "modules"):
        path = Path(__file__).resolve().parents[1] / "rl_gap" / package / "__init__.py"
        block = next(
            node
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        )
        named = {a.name for imp in block.body for a in imp.names}
        assert set(importlib.import_module(f"rl_gap.{package}").__all__) == named, package
