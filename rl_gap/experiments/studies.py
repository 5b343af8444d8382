"""The gSAP paper's hyper-parameter studies as sweeps with a table and a plot.

- :func:`neg_drop_main` (``python -m research.studies neg_drop``): gAP and mAP against
  the negative-dropping rate α (the α fraction of lowest-similarity negatives
  of every batch removed before the loss; the paper's Figure 2 / Table M, α up
  to 99.9%).
- :func:`temperature_main` (``python -m research.studies temperature``): gAP and mAP
  against the temperature τ for each loss (the paper's §B.3: gAP plateaus
  for τ ≤ 0.01 and collapses for τ ≥ 0.1).

Each trains every setting with ``--num-seeds`` seeds through the training CLI
(:mod:`rl_gap.experiments.grid`) and reports the test split (every run gets
``data.val_split 0``, whatever the recipe's validation split), then writes ``<name>.csv`` (mean ± std per
setting, every metric), ``<name>_runs.csv`` (one row per run), ``<name>.md``
and ``<name>.png`` to ``--output``, and prints the table.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_gap.experiments.grid import Setting, add_grid_arguments, on_test_split, sweep
from rl_gap.experiments.runner import recipe_loss
from rl_gap.experiments.tables import RANKING_RULE, ranking_lines, settings_metrics_table

ALPHAS = (0.0, 0.5, 0.9, 0.95, 0.99, 0.999)
TEMPERATURES = (1e-4, 1e-3, 1e-2, 5e-2, 1e-1, 5e-1)


def _demo(*losses: str) -> list[str]:
    return [f"recipes/demo/mnist_{loss}.yaml" for loss in losses]


def _finish(
    name: str, out: Path, agg: list[dict], by: list[str], seconds: float, plot_fn
) -> list[dict[str, Any]]:
    table = settings_metrics_table(agg, by)
    if "loss" in by:
        others = [k for k in by if k != "loss"]
        verdicts = ranking_lines(agg, label="loss", group_by=others)
        if verdicts:
            table += "\n\n" + "\n".join([f"ranking rule: {RANKING_RULE}.", *verdicts])
    png = plot_fn(agg, out / f"{name}.png")
    (out / f"{name}.md").write_text(f"# {name}\n\n{table}\n\n![{name}]({png.name})\n")
    print(f"\n{table}\n\nwall time {seconds:.0f} s; {out / f'{name}.csv'}, {png}")
    return agg


def plot_against(
    agg: Sequence[dict[str, Any]],
    x: str,
    path: Path,
    xlabel: str,
    transform=lambda v: v,
    tick_labels: bool = False,
) -> Path:
    """gAP and mAP (mean ± std, %) against ``x``, one line per loss, log x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), constrained_layout=True)
    losses = list(dict.fromkeys(r["loss"] for r in agg))
    for ax, metric in zip(axes, ("gAP", "mAP")):
        for loss in losses:
            pts = sorted((transform(r[x]), r) for r in agg if r["loss"] == loss)
            xs = [p for p, _ in pts]
            mean = [100 * r[f"{metric}_mean"] for _, r in pts]
            std = [100 * r[f"{metric}_std"] for _, r in pts]
            ax.errorbar(xs, mean, yerr=std, marker="o", capsize=3, label=loss)
        ax.set_xscale("log")
        if tick_labels:  # label the points with the setting's own value (α, not 1 − α)
            values = sorted({(transform(r[x]), r[x]) for r in agg})
            ax.set_xticks([t for t, _ in values], [f"{v:g}" for _, v in values])
            ax.minorticks_off()
            ax.invert_xaxis()
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{metric} (%)")
        ax.grid(alpha=0.3)
        ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ------------------------------------------------------------------ negative dropping
def neg_drop_main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Negative-dropping sweep: gAP/mAP vs α; returns the aggregated rows."""
    parser = argparse.ArgumentParser(description=neg_drop_main.__doc__)
    add_grid_arguments(parser, _demo("gsap"))
    parser.add_argument("--alphas", type=float, nargs="+", default=list(ALPHAS))
    args = parser.parse_args(argv)
    for a in args.alphas:
        if not 0.0 <= a < 1.0:
            raise ValueError(f"--alphas must be in [0, 1), got {a}")
    return _sweep(
        args, "neg_drop", "alpha", "--model.init_args.loss.neg_drop", args.alphas,
        lambda agg, path: plot_against(
            agg, "alpha", path, "α, fraction of negatives dropped (log scale of 1 − α)",
            transform=lambda a: 1.0 - a, tick_labels=True,
        ),
    )  # fmt: skip


# ------------------------------------------------------------------ temperature
def temperature_main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Temperature sweep: gAP/mAP vs τ per loss; returns the aggregated rows."""
    parser = argparse.ArgumentParser(description=temperature_main.__doc__)
    add_grid_arguments(parser, _demo("gsap", "msap"))
    parser.add_argument("--temperatures", type=float, nargs="+", default=list(TEMPERATURES))
    args = parser.parse_args(argv)
    for t in args.temperatures:
        if not t > 0:
            raise ValueError(f"--temperatures must be > 0, got {t}")
    return _sweep(
        args, "temperature", "tau", "--model.init_args.loss.temperature", args.temperatures,
        lambda agg, path: plot_against(agg, "tau", path, "temperature τ (log)"),
    )  # fmt: skip


def _sweep(
    args: argparse.Namespace, study: str, column: str, flag: str, values: list[float], plot: Any
) -> list[dict[str, Any]]:
    """Train every recipe at every value of one loss setting over the seeds; aggregate,
    write the tables and the plot (``runs/studies/<study>`` unless ``--output``)."""
    out = Path(args.output or f"runs/studies/{study}").resolve()
    settings = [
        Setting({"loss": recipe_loss(r), column: v}, r,
                (*on_test_split(r), flag, repr(v)), f"{recipe_loss(r)}/{column}_{v:g}")
        for r in args.recipes for v in values
    ]  # fmt: skip
    by = ["loss", column]
    agg, seconds = sweep(args, settings, out, study, study, by)
    return _finish(study, out, agg, by, seconds, plot)
