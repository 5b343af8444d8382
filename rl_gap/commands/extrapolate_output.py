"""What ``rl-gap extrapolate`` shows: progress bars, the table, JSON, CSV and the plot's path check."""

from __future__ import annotations

import csv
import io
import json
import os
import sys

from rl_gap.commands.atomic_output import write_text_atomic
from rl_gap.metrics.tail.registry import get_estimator

#: Widest table printed (columns), whatever the terminal.
TABLE_WIDTH = 100


class Progress:
    """One rich progress bar per stage on stderr; a no-op with ``enabled=False``."""

    def __init__(self, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description:<40}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self.bar.start()

    def stage(self, description: str, total: int):
        """A callable ``update(done[, text])`` for a new stage of ``total`` steps."""
        if self.bar is None:
            return lambda done, text=None: None
        task = self.bar.add_task(description, total=total)

        def update(done: int, text: str | None = None) -> None:
            label = description if text is None else f"{description}: {text}"
            self.bar.update(task, completed=done, description=label)

        return update

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def write_json(path: str | None, out: dict, quiet: bool = False) -> None:
    if not path:
        return
    write_text_atomic(path, json.dumps(out, indent=2))  # a full disk keeps the previous file
    if not quiet:
        print(f"results written to {path}")


def emit(out: dict, fmt: str) -> None:
    if fmt == "json":
        json.dump(out, sys.stdout, indent=2)
        print()
    elif fmt == "csv":
        sys.stdout.write(results_csv(out))
    else:
        _print_table(out)


#: Columns of ``--format csv``, one row per estimator.
CSV_COLUMNS = ("estimator", "map", "ci_low", "ci_high", "ci_total_low", "ci_total_high",
               "budget_converged", "supported", "flags", "gallery_size", "k", "sample_size",
               "n_queries")  # fmt: skip


def results_csv(out: dict) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for name, r in out["estimators"].items():
        ci, total = r.get("ci") or [None, None], r.get("ci_total") or [None, None]
        budget = r.get("budget")
        writer.writerow([
            name, r["map"], ci[0], ci[1], total[0], total[1],
            "" if budget is None else budget["converged"], r.get("supported", ""),
            "; ".join(r.get("flags", [])), out["gallery_size"], out["k"], out["sample_size"],
            out["n_queries"],
        ])  # fmt: skip
    return buffer.getvalue()


def check_plot_path(path: str) -> None:
    """Raise ValueError unless matplotlib can write ``path``'s extension (checked before any work)."""
    from matplotlib.backend_bases import FigureCanvasBase

    supported = FigureCanvasBase.get_supported_filetypes()
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in supported:
        raise ValueError(
            f"--plot {path!r}: unsupported image extension {ext or '(none)'!r}; "
            f"use one of {', '.join(sorted(supported))}"
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"--plot {path!r}: folder {folder!r} does not exist")


def _interval(ci) -> str:
    return "-" if ci is None else f"[{ci[0]:.4f}, {ci[1]:.4f}]"


def _print_table(out: dict) -> None:
    """The results in at most :data:`TABLE_WIDTH` columns; flags and notes listed below."""
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"mAP@{out['k']} at N = {out['gallery_size']:,} from S = {out['sample_size']:,} "
        f"({out['n_queries']} queries, {out['n_excluded']} excluded)",
        title_justify="left",
    )
    for col in ("estimator", f"mAP@{out['k']}", "95% CI", "CI + threshold", "S/4 · S/2 · S", "ok"):
        table.add_column(col, no_wrap=True)
    lines = []
    for name, r in out["estimators"].items():
        budget = r.get("budget")
        budget_txt = " ".join(f"{lv['map']:.3f}" for lv in budget["levels"]) if budget else ""
        if get_estimator(name).realized:
            lines.append(f"{name}: the metric of the sample gallery (N = {out['sample_size']:,})")
        if r.get("n_tail_fallback"):
            lines.append(f"{name}: {r['n_tail_fallback']} degenerate tails counted")
        if "nested_ci" in r:
            lines.append(
                f"{name}: joint CI {_interval(r['nested_ci'])} "
                f"(distractor-sample sd {r['sample_noise_sd']:.4f})"
            )
        lines += [f"{name}: NOT SUPPORTED: {flag}" for flag in r.get("flags", [])]
        ok = "" if "supported" not in r else ("yes" if r["supported"] else "NO")
        table.add_row(name, f"{r['map']:.4f}", _interval(r["ci"]),
                      _interval(r.get("ci_total")), budget_txt, ok)  # fmt: skip
    console = Console(width=TABLE_WIDTH)
    console.print(table)
    for line in lines:
        console.print(line, soft_wrap=False, overflow="fold", markup=False)
