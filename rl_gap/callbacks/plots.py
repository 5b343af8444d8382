"""The evaluation plots: the global precision-recall curve and the per-query threshold histogram.

:func:`save_consistency_plots` writes both as PNGs (the gSAP paper's consistency view:
each query's F1-optimal threshold against the one shared threshold); :func:`send_plots`
logs them to a W&B run with W&B's own line chart of the curve beside the image.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_gap.callbacks.curves import global_pr_curve, per_query_best_thresholds
from rl_gap.metrics.functional import ranking
from rl_gap.metrics.functional.ranking import global_f1_from_state


def send_plots(run, plots: ConsistencyPlots, stage: str, step: int, title: str) -> None:
    """The PNGs, W&B's own line chart of the PR curve (a Table) and the threshold histogram."""
    import wandb

    table = wandb.Table(columns=["recall", "precision"], data=plots.pr_points)
    run.log(
        {
            f"{stage}/pr_curve": wandb.Image(str(plots.pr_curve)),
            f"{stage}/pr_curve_chart": wandb.plot.line(
                table, "recall", "precision", title=f"PR curve ({title})"
            ),
            f"{stage}/query_thresholds": wandb.Image(str(plots.thresholds)),
            f"{stage}/query_threshold_hist": wandb.Histogram(plots.query_thresholds),
            "trainer/global_step": step,
        }
    )


@dataclass
class ConsistencyPlots:
    """Files and numbers of :func:`save_consistency_plots`."""

    pr_curve: Path
    thresholds: Path
    gap: float  # area under the plotted curve's steps (the global AP)
    prevalence: float  # positive pairs / all pairs: a random ranking's precision
    shared_threshold: float  # global-F1 threshold, the histogram's line
    pr_points: list[list[float]]  # (recall, precision), subsampled
    query_thresholds: Any  # numpy array: each query's F1-optimal threshold

    def __getitem__(self, key: str) -> Path:  # plots["pr_curve"], as the files' dict was
        return {"pr_curve": self.pr_curve, "thresholds": self.thresholds}[key]


def save_consistency_plots(
    state,
    folder: Path,
    stem: str,
    max_points: int = 2000,
    title: str = "",
    threshold_key: str = "threshold_f1g",
) -> ConsistencyPlots:
    """Write ``<stem>_pr_curve.png`` and ``<stem>_thresholds.png`` into ``folder``.

    The PR curve states its AP and the prevalence baseline (positive pairs / all pairs,
    the precision of a random ranking) and ``title`` (run, stage, epoch); the histogram's
    vertical line is the shared global-F1 threshold, labelled with ``threshold_key``, the
    key under which its value is logged.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    precision, recall, _ = global_pr_curve(state)
    gap = float(ranking.global_ap_from_state(state))
    num_pos = float(state.num_positives.sum())
    prevalence = num_pos / max(1.0, num_pos + float(state.num_negatives.sum()))
    step = max(1, len(recall) // max_points)
    fig, ax = plt.subplots(figsize=(5, 4.2))
    ax.plot(recall[::step].numpy(), precision[::step].numpy(), label=f"AP = {gap:.4f}")
    ax.axhline(prevalence, color="gray", ls="--", label=f"random ranking = {prevalence:.4f}")
    ax.set(xlabel="recall (all pairs)", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02))
    ax.set_title(f"global precision-recall\n{title}" if title else "global precision-recall",
                 fontsize=9)  # fmt: skip
    ax.legend(loc="upper right", fontsize=8)
    pr_path = folder / f"{stem}_pr_curve.png"
    fig.tight_layout()
    fig.savefig(pr_path, dpi=100)
    plt.close(fig)

    thresholds, _ = per_query_best_thresholds(state)
    _, shared = global_f1_from_state(state)
    fig, ax = plt.subplots(figsize=(5, 4.2))
    ax.hist(thresholds.numpy(), bins=50, color="tab:blue", alpha=0.8)
    ax.axvline(float(shared), color="tab:red",
               label=f"shared (global F1) threshold\n{threshold_key} = {float(shared):.4f}")  # fmt: skip
    ax.set(xlabel="per-query F1-optimal threshold", ylabel="queries")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    th_path = folder / f"{stem}_thresholds.png"
    fig.tight_layout()
    fig.savefig(th_path, dpi=100)
    plt.close(fig)
    points = [[float(r), float(p)] for r, p in zip(recall[::step], precision[::step], strict=True)]
    return ConsistencyPlots(
        pr_path, th_path, gap, prevalence, float(shared), points, thresholds.numpy()
    )
