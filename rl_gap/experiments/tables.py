"""Aggregating runs into mean ± std tables, written as CSV and Markdown and printed.

A *row* is one run: a dict of settings (``loss``, ``seed``, ``alpha``, ...)
and metric values in [0, 1] under the table names of
:data:`rl_gap.experiments.runner.METRICS` (gAP, mAP, R@1, R@P90, F1g, F1q).
:func:`aggregate` groups rows by settings and reports, per metric, the mean
and the sample standard deviation (``ddof=1``; 0 for a single run) over seeds.
Tables show percentages with two decimals.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rl_gap.experiments.runner import METRICS


def metric_row(metrics: dict[str, float], prefix: str = "val/") -> dict[str, float]:
    """Table-named metrics (gAP, mAP, ...) from a run's logged ``val/*`` values (NaN if absent)."""
    return {name: float(metrics.get(prefix + key, math.nan)) for name, key in METRICS.items()}


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0.0 for one value)."""
    if not values:
        raise ValueError("mean_std of no values")
    n = len(values)
    mean = math.fsum(values) / n
    if n == 1:
        return mean, 0.0
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def aggregate(
    rows: Iterable[dict[str, Any]], by: Sequence[str], metrics: Sequence[str] = tuple(METRICS)
) -> list[dict[str, Any]]:
    """One row per distinct ``by`` settings (first-seen order): ``<m>_mean``, ``<m>_std``, ``n``."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in by), []).append(row)
    out = []
    for key, members in groups.items():
        agg: dict[str, Any] = dict(zip(by, key))
        for m in metrics:
            agg[f"{m}_mean"], agg[f"{m}_std"] = mean_std([float(r[m]) for r in members])
        agg["n"] = len(members)
        out.append(agg)
    return out


def cell(row: dict[str, Any], metric: str) -> str:
    """``"12.34 ± 0.56"`` (percent) from an aggregated row; ``"12.34 (n = 1)"`` for a single run.

    One run has no spread to report: "± 0.00" would read as a measured zero.
    """
    mean = f"{100 * row[f'{metric}_mean']:.2f}"
    if row.get("n") == 1:
        return f"{mean} (n = 1)"
    return f"{mean} ± {100 * row[f'{metric}_std']:.2f}"


def write_csv(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Rows as CSV (columns: union of keys, first-seen order); floats with full precision."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in row.items()})
    return path


def markdown_table(header: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in body]
    return "\n".join(lines)


def settings_metrics_table(
    rows: Sequence[dict[str, Any]], settings: Sequence[str], metrics: Sequence[str] = tuple(METRICS)
) -> str:
    """Markdown: one line per aggregated row, the settings then ``mean ± std`` per metric (%)."""
    body = [[_fmt(r[s]) for s in settings] + [cell(r, m) for m in metrics] for r in rows]
    return markdown_table([*settings, *(f"{m} (%)" for m in metrics)], body)


def pivot_table(
    rows: Sequence[dict[str, Any]], index: Sequence[str], column: str, metric: str
) -> str:
    """Markdown: one line per ``index`` settings, one column per value of ``column``: ``metric``."""
    columns: list[Any] = []
    lines: dict[tuple, dict[Any, str]] = {}
    for r in rows:
        if r[column] not in columns:
            columns.append(r[column])
        lines.setdefault(tuple(r[k] for k in index), {})[r[column]] = cell(r, metric)
    body = [
        [*map(_fmt, key), *(values.get(c, "") for c in columns)] for key, values in lines.items()
    ]
    return markdown_table([*index, *(f"{c} {metric} (%)" for c in columns)], body)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
