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

Paired verdicts (:func:`paired_verdict`, :func:`paired_verdicts`): runs of two losses
with the same seed share the initialisation and the data order, so they are
compared seed by seed: the per-seed differences ``a − b``, their mean ± std
(ddof=1), the number of seeds where ``a`` is ahead, the paired t statistic
``mean / (std / √n)`` with its two-sided p-value (Student t, n − 1 degrees of
freedom) and the two-sided sign-test p-value (exact binomial, ties dropped).
The unpaired ranking rule above is for rows whose runs are not paired.

:data:`CONSISTENCY`: the consistency ceiling C and the efficiency gAP / C
(``rl_gap.metrics.functional.ceiling``), the split of a gAP gain into "the
per-query rankings got better" (C) and "the scores got comparable across
queries" (gAP / C).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_gap.experiments.runner import METRICS

#: table column -> logged key of the consistency ceiling C and the efficiency gAP / C
CONSISTENCY: dict[str, str] = {"C": "ceiling", "gAP/C": "efficiency"}


def metric_row(
    metrics: dict[str, float], prefix: str = "val/", names: dict[str, str] | None = None
) -> dict[str, float]:
    """Table-named metrics (gAP, mAP, ...) from a run's logged ``val/*`` values (NaN if absent).

    ``names``: table column -> logged key (default :data:`METRICS`).
    """
    names = METRICS if names is None else names
    return {name: float(metrics.get(prefix + key, math.nan)) for name, key in names.items()}


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


# ------------------------------------------------------------------ paired verdicts
PAIRED_RULE = (
    "paired by seed (same initialisation and data order): per-seed differences a − b, "
    "mean ± std (ddof=1), seeds where a is ahead, paired t = mean / (std / √n) with its "
    "two-sided p (Student t, n − 1 dof), two-sided sign-test p (ties dropped)"
)


@dataclass(frozen=True)
class PairedVerdict:
    """Seed-by-seed comparison of rows ``a`` and ``b`` on one metric.

    Attributes:
        a, b: the two compared labels (``diffs`` are ``a − b``).
        metric: table name of the metric (gAP, mAP, ...).
        seeds: the seeds both have, in ascending order.
        diffs: per-seed differences ``a − b`` (metric units, [0, 1] scale).
        mean, std: mean and sample std (ddof=1; 0 for one seed) of ``diffs``.
        wins, losses: seeds where ``a`` is ahead / behind (exact ties count in neither).
        t: paired t statistic (NaN with fewer than 2 seeds; ±inf when every difference
            is equal and non-zero).
        p_t: two-sided p-value of ``t`` (NaN with fewer than 2 seeds).
        p_sign: two-sided exact sign-test p-value (1.0 when every seed ties).
    """

    a: Any
    b: Any
    metric: str
    seeds: tuple[Any, ...]
    diffs: tuple[float, ...]
    mean: float
    std: float
    wins: int
    losses: int
    t: float
    p_t: float
    p_sign: float

    @property
    def n(self) -> int:
        return len(self.diffs)

    def line(self) -> str:
        """``"gAP: gsap ahead of msap in 5/5 seeds, +3.29 ± 1.43 points (paired t = 5.14, p = 0.0068;
        sign test p = 0.062)"``."""
        if self.n < 2:
            test = "one seed: no paired test"
        else:
            test = f"paired t = {self.t:.2f}, p = {_p(self.p_t)}; sign test p = {_p(self.p_sign)}"
        ties = self.n - self.wins - self.losses
        tied = f", tied in {ties}" if ties else ""
        return (
            f"{self.metric}: {self.a} ahead of {self.b} in {self.wins}/{self.n} seeds{tied}, "
            f"{100 * self.mean:+.2f} ± {100 * self.std:.2f} points ({test})"
        )


def sign_test_p(wins: int, losses: int) -> float:
    """Two-sided exact sign test: P(a split at least as uneven as ``wins``:``losses``) under 1/2."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = math.fsum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_t(diffs: Sequence[float]) -> tuple[float, float]:
    """(t, two-sided p) of the one-sample t test of mean(diffs) = 0 (NaN, NaN for n < 2)."""
    n = len(diffs)
    if n < 2:
        return math.nan, math.nan
    mean, std = mean_std(diffs)
    if std == 0.0:
        if mean == 0.0:
            return 0.0, 1.0
        return math.copysign(math.inf, mean), 0.0
    t = mean / (std / math.sqrt(n))
    from scipy.stats import t as student  # scipy comes with mlxtend, a dependency

    return t, float(2 * student.sf(abs(t), n - 1))


def paired_verdict(
    rows: Iterable[dict[str, Any]],
    metric: str,
    a: Any,
    b: Any,
    label: str = "loss",
    pair_by: str = "seed",
) -> PairedVerdict:
    """Compare ``label == a`` with ``label == b`` on ``metric``, run by run, paired by ``pair_by``.

    ``rows`` are single runs (one per label and seed, metric in [0, 1]). Seeds that only
    one of the two has are left out; a seed given twice for one label is an error.

    Raises:
        ValueError: no seed in common, or a duplicated (label, seed).
    """
    values: dict[Any, dict[Any, float]] = {a: {}, b: {}}
    for row in rows:
        if row[label] in values:
            seen = values[row[label]]
            if row[pair_by] in seen:
                raise ValueError(f"two runs of {label}={row[label]} with {pair_by}={row[pair_by]}")
            seen[row[pair_by]] = float(row[metric])
    seeds = tuple(sorted(set(values[a]) & set(values[b])))
    if not seeds:
        raise ValueError(f"{label}={a} and {label}={b} have no {pair_by} in common to pair")
    diffs = tuple(values[a][s] - values[b][s] for s in seeds)
    mean, std = mean_std(diffs)
    wins, losses = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    t, p_t = paired_t(diffs)
    return PairedVerdict(a, b, metric, seeds, diffs, mean, std, wins, losses, t, p_t,
                         sign_test_p(wins, losses))  # fmt: skip


def paired_verdicts(
    rows: Sequence[dict[str, Any]],
    metrics: Sequence[str] = tuple(METRICS),
    label: str = "loss",
    pair_by: str = "seed",
) -> list[PairedVerdict]:
    """Every pair of labels (first-seen order: first minus later) on every metric."""
    labels: list[Any] = []
    for row in rows:
        if row[label] not in labels:
            labels.append(row[label])
    return [
        paired_verdict(rows, metric, a, b, label, pair_by)
        for i, a in enumerate(labels)
        for b in labels[i + 1 :]
        for metric in metrics
    ]


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"
