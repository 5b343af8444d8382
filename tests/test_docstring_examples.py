"""Every ``>>>`` example in rl_gap's docstrings runs and prints what it says.

The modules are found by walking the installed package (``pkgutil``), not by
a list of paths, so examples keep running when modules move. The public API's
entry points must each carry at least one example.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import rl_gap

OPTIONS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS


def _walk() -> tuple[list[str], list[str]]:
    names, failures = [], []
    for info in pkgutil.walk_packages(rl_gap.__path__, "rl_gap.", onerror=failures.append):
        names.append(info.name)
    return names, failures


MODULES, WALK_ERRORS = _walk()


def _collect() -> tuple[dict[str, doctest.DocTest], dict[str, str]]:
    """Docstring tests with at least one example, by name; modules that failed to import."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests, import_errors = {}, {}
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # reported by test_every_module_imports
            import_errors[name] = f"{type(exc).__name__}: {exc}"
            continue
        for test in finder.find(module, name):
            if test.examples:
                tests[test.name] = test
    return tests, import_errors


DOCTESTS, IMPORT_ERRORS = _collect()


def test_every_module_imports() -> None:
    # a module that cannot be imported would silently drop its examples
    assert len(MODULES) > 50, MODULES
    assert not WALK_ERRORS, WALK_ERRORS
    assert not IMPORT_ERRORS, IMPORT_ERRORS


@pytest.mark.parametrize("name", sorted(DOCTESTS))
def test_docstring_example(name: str) -> None:
    test = DOCTESTS[name]
    # a fresh copy of the globals per run: an example never sees another's names
    test.globs = dict(test.globs)
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    report: list[str] = []
    runner.run(test, out=report.append, clear_globs=True)
    result = runner.summarize(verbose=False)
    assert result.attempted == len(test.examples)
    assert result.failed == 0, "".join(report)


def _public() -> dict[str, object]:
    from rl_gap.losses import build_loss
    from rl_gap.metrics import RetrievalMetrics, TailExtrapolatedMAP
    from rl_gap.metrics.functional import evaluate_embeddings, global_ap
    from rl_gap.metrics.tail import predict_map

    return {
        "build_loss": build_loss,
        "evaluate_embeddings": evaluate_embeddings,
        "global_ap": global_ap,
        "RetrievalMetrics": RetrievalMetrics,
        "predict_map": predict_map,
        "TailExtrapolatedMAP": TailExtrapolatedMAP,
    }


@pytest.mark.parametrize("public_name", list(_public()))
def test_public_api_has_a_runnable_example(public_name: str) -> None:
    obj = _public()[public_name]
    examples = doctest.DocTestParser().get_examples(obj.__doc__ or "")
    assert examples, f"{public_name}'s docstring has no >>> example"
    # the example is one the walk above found, so test_docstring_example runs it
    assert f"{obj.__module__}.{obj.__qualname__}" in DOCTESTS, sorted(DOCTESTS)
