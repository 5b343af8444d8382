"""Validation of metric arguments (cut-offs, precision levels, bootstrap counts).

Shared by the functional API, the torchmetrics classes (checked at construction),
the Lightning callback and the command line, so a bad value fails at once with a
message naming it, never as a torch range error after training or as a silently
different metric (``k=1.5`` counted as R@2, two precision levels on one key).
"""

from __future__ import annotations

import numbers

__all__ = [
    "check_k",
    "check_ks",
    "check_precision",
    "check_precisions",
    "check_count",
    "check_block_size",
    "precision_tag",
]


def check_k(k, name: str = "k") -> int:
    """A cut-off: a Python/numpy integer >= 1 (floats such as 1.5 or 2.0 are refused)."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= 1, got {k!r} ({type(k).__name__})")
    if k < 1:
        raise ValueError(f"{name} must be >= 1, got {k}")
    return int(k)


def check_ks(ks, name: str = "ks") -> tuple[int, ...]:
    """Distinct cut-offs, each ``check_k``."""
    if isinstance(ks, (str, bytes)) or not hasattr(ks, "__iter__"):
        raise ValueError(f"{name} must be a sequence of integers, got {ks!r}")
    out = tuple(check_k(k, f"{name} entry") for k in ks)
    if len(set(out)) != len(out):
        raise ValueError(f"{name} has duplicate values: {list(out)}")
    return out


def check_precision(precision, name: str = "precision") -> float:
    """A precision level in (0, 1]."""
    if isinstance(precision, bool) or not isinstance(precision, numbers.Real):
        raise ValueError(f"{name} must be a number in (0, 1], got {precision!r}")
    if not 0.0 < float(precision) <= 1.0:
        raise ValueError(f"{name} must be in (0, 1], got {precision}")
    return float(precision)


def precision_tag(precision: float) -> str:
    """Key suffix of a precision level: 0.9 -> ``"90"``, 0.904 -> ``"90.4"`` (``r@p90.4``)."""
    return f"{round(float(precision) * 100, 6):g}"


def check_precisions(precisions, name: str = "precisions") -> tuple[float, ...]:
    """Precision levels in (0, 1] whose keys (``precision_tag``) are distinct."""
    if isinstance(precisions, (str, bytes)) or not hasattr(precisions, "__iter__"):
        raise ValueError(f"{name} must be a sequence of numbers in (0, 1], got {precisions!r}")
    out = tuple(check_precision(p, f"{name} entry") for p in precisions)
    tags = [precision_tag(p) for p in out]
    if len(set(tags)) != len(tags):
        raise ValueError(
            f"{name} {list(out)} give the same metric key twice ({['r@p' + t for t in tags]}); "
            "use distinct levels"
        )
    return out


def check_count(value, name: str, minimum: int = 0) -> int:
    """An integer count >= ``minimum`` (e.g. bootstrap samples: 0 = none)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_block_size(block_size, name: str = "block_size") -> int | tuple[int, int]:
    """GEMM block: an integer >= 1 or a pair (rows, columns) of them."""
    if isinstance(block_size, (tuple, list)):
        if len(block_size) != 2:
            raise ValueError(f"{name} must be an integer or (rows, columns), got {block_size!r}")
        return (check_count(block_size[0], name, 1), check_count(block_size[1], name, 1))
    return check_count(block_size, name, 1)
