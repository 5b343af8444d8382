"""Aggregating runs into mean ± std tables, written as CSV and Markdown and printed.

A *row* is one run: a dict of settings (``loss``, ``seed``, ``alpha``, ...)
and metric values in [0, 1] under the table names of
:data:`rl_gap.experiments.runner.METRICS` (gAP, mAP, R@1, R@P90, F1g, F1q, MAP@R,
R-prec); a row without a metric (an older run) counts it as NaN.
:func:`aggregate` groups rows by settings and reports, per metric, the mean
and the sample standard deviation (``ddof=1``; 0 for a single run) over seeds.
Tables show percentages with two decimals.

Ranking rule (:func:`leader`, :func:`ranking_lines`): on a metric, the row with
the highest mean is named best only when, against *every* other row, its lead
of means exceeds the sum of the two standard deviations,
``mean_best − mean_other > std_best + std_other``, and every row has at least
two seeds (one seed has no spread). Otherwise the rows are tied on that
metric. The demo, ``rl-gap tune``, ``rl-gap sweep-scarce`` and the studies
print this verdict under their tables.
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
            agg[f"{m}_mean"], agg[f"{m}_std"] = mean_std(
                [float(r.get(m, math.nan)) for r in members]
            )
        agg["n"] = len(members)
        out.append(agg)
    return out


def leader(
    rows: Sequence[dict[str, Any]], metric: str, label: str = "loss"
) -> tuple[Any | None, str]:
    """The best row's ``label`` under the ranking rule (module docstring), or None; and why.

    ``rows`` are aggregated rows (``<metric>_mean``, ``<metric>_std``, ``n``). The
    reason names the tightest comparison: ``"lead 1.20 > spread 0.45 points over msap"``
    (percentage points) when a leader is named, else the comparison that ties it.
    """
    ranked = [r for r in rows if not math.isnan(float(r[f"{metric}_mean"]))]
    if len(ranked) < 2:
        return None, "fewer than two rows to compare"
    ranked.sort(key=lambda r: -float(r[f"{metric}_mean"]))
    best = ranked[0]
    if any(int(r.get("n", 1)) < 2 for r in ranked):
        return None, "one seed: no spread to compare a lead with"
    margins = []
    for other in ranked[1:]:
        lead = float(best[f"{metric}_mean"]) - float(other[f"{metric}_mean"])
        spread = float(best[f"{metric}_std"]) + float(other[f"{metric}_std"])
        margins.append((lead - spread, lead, spread, other[label]))
    worst = min(margins, key=lambda m: m[0])
    _, lead, spread, other = worst
    if worst[0] > 0:
        return best[label], f"lead {100 * lead:.2f} > spread {100 * spread:.2f} points over {other}"
    return None, (
        f"{best[label]} vs {other}: lead {100 * lead:.2f} <= spread {100 * spread:.2f} points"
    )


def ranking_lines(
    rows: Sequence[dict[str, Any]],
    metrics: Sequence[str] = tuple(METRICS),
    label: str = "loss",
    group_by: Sequence[str] = (),
    scope: str = "this table",
) -> list[str]:
    """One verdict per metric (and per ``group_by`` settings): best ``label`` or tied."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in group_by), []).append(r)
    lines = []
    for key, members in groups.items():
        if len({m[label] for m in members}) < 2:
            continue
        where = " ".join(f"{k}={_fmt(v)}" for k, v in zip(group_by, key))
        for metric in metrics:
            best, why = leader(members, metric, label)
            head = f"{where}: {metric}" if where else metric
            if best is None:
                lines.append(f"{head}: tied on {scope} ({why})")
            else:
                lines.append(f"{head}: best {best} ({why})")
    return lines


RANKING_RULE = (
    "best = lead of means over every other row > sum of the two stds (>= 2 seeds each), else tied"
)


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
