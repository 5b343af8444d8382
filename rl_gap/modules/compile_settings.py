"""The ``compile`` argument of a module, checked without importing torch.

``compile`` is False/None (off), True (``torch.compile`` defaults) or a mapping of
``torch.compile`` keywords. torch reports a wrong value deep inside the module's
constructor (``dynamic: maybe`` fails an assertion); checking it here lets the command
line's early check and the module both say what is wrong in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COMPILE_OPTIONS = ("backend", "mode", "dynamic", "fullgraph", "options")


def compile_settings_error(settings: Any) -> str | None:
    """Why ``settings`` is not a valid ``compile`` value (one line), or None.

    Checks the form only: ``backend`` and ``mode`` names are checked against torch's
    lists by :func:`rl_gap.modules.base.compile_in_place`.
    """
    if settings is None or isinstance(settings, bool):
        return None
    if not isinstance(settings, Mapping):
        return f"expected true, false or a mapping of torch.compile options, got {settings!r}"
    unknown = sorted(set(settings) - set(COMPILE_OPTIONS))
    if unknown:
        return f"unknown torch.compile option(s) {unknown}; known: {list(COMPILE_OPTIONS)}"
    expected = {
        "dynamic": ("true, false or null", lambda v: v is None or isinstance(v, bool)),
        "fullgraph": ("true or false", lambda v: isinstance(v, bool)),
        "mode": ("a mode name or null", lambda v: v is None or isinstance(v, str)),
        "backend": ("a backend name", lambda v: isinstance(v, str) or callable(v)),
        "options": ("a mapping or null", lambda v: v is None or isinstance(v, Mapping)),
    }
    for key, value in settings.items():
        kind, valid = expected[key]
        if not valid(value):
            return f"{key} must be {kind}, got {value!r}"
    return None
