"""Package faces that import their public names on first use (PEP 562).

``import rl_gap.metrics.tail`` used to import every submodule a package
re-exports, and with them torchmetrics, torchvision and ``torch._dynamo``; a
command's ``--help`` paid seconds for names it never touched. A package now
lists where each public name lives, and the first access imports only that
submodule::

    __getattr__, __dir__ = lazy_exports(__name__, globals(), {"GlobalAP": ".retrieval"})

A package writes its exports grouped by submodule, each name once (:func:`by_module`), and
takes ``__all__`` from them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str, namespace: dict[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` resolving ``exports`` (name -> submodule,
    relative to ``package`` when it starts with a dot) on first access, then caching the
    value in ``namespace`` so later look-ups are plain attribute reads."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__


def by_module(groups: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """``{submodule: names}`` -> ``{name: submodule}`` (what :func:`lazy_exports` takes).

    Raises:
        ValueError: a name listed under two submodules.
    """
    exports: dict[str, str] = {}
    for module, names in groups.items():
        for name in names:
            if name in exports:
                raise ValueError(f"{name!r} is exported from both {exports[name]} and {module}")
            exports[name] = module
    return exports
