"""Figure for ``rl-gap extrapolate --plot``: predicted mAP@k against gallery size.

What a researcher wants to see at a glance: each estimator's prediction as a
function of N (log axis, from the sample sizes to beyond the target) with its
query-bootstrap band, the metric actually measured on nested sub-samples of
the sample (S/8 … S) as points (does the prediction continue their trend?),
and the target N with the predicted values there.
"""

from __future__ import annotations

import numpy as np

from rl_gap.metrics.tail.predictor import TailPredictor
from rl_gap.metrics.tail.registry import get_estimator

_COLORS = {
    "sample": "tab:gray",
    "count": "tab:orange",
    "evt": "tab:blue",
    "tail": "tab:green",
    "single_x": "tab:brown",
    "powerlaw": "tab:purple",
    "loguniform": "tab:pink",
}
_LABELS = {
    "sample": "sample (metric at S, naive)",
    "count": "count (x = K/S)",
    "evt": "evt (plug-in GPD tail)",
    "tail": "tail (GPD posterior, predictive)",
    "single_x": "single x (homogeneous hardness)",
    "powerlaw": "power-law fit of mAP(n)",
    "loguniform": "log-uniform fit of mAP(n)",
}


def plot_extrapolation(
    predictor: TailPredictor,
    gallery_size: int,
    path: str,
    estimators: tuple[str, ...] = ("sample", "count", "evt", "tail"),
    rank_law: str | None = None,
    n_points: int = 25,
    n_boot: int = 300,
) -> dict:
    """Draw the extrapolation figure to ``path`` (PNG/PDF by extension); return its data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    S = predictor.sample_size
    hi = max(4 * gallery_size, 10 * S)
    sizes = np.unique(np.geomspace(S, hi, n_points).astype(np.int64))
    sizes = np.unique(np.append(sizes, gallery_size))
    measured = predictor.measured(n_boot=n_boot)
    data: dict = {"sizes": sizes.tolist(), "measured": measured, "curves": {}}

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for name in estimators:
        color = _COLORS.get(name, None)
        if get_estimator(name).realized:
            est = predictor.estimate(name, S, n_boot=n_boot)
            ax.axhline(est.map, color=color, ls="--", lw=1.2, label=_LABELS.get(name, name))
            ax.axhspan(est.ci[0], est.ci[1], color=color, alpha=0.12)
            data["curves"][name] = {"map": est.map, "ci": list(est.ci)}
            continue
        maps, los, his = predictor.curve(name, sizes.tolist(), rank_law, n_boot)
        ax.plot(sizes, maps, color=color, lw=2, label=_LABELS.get(name, name))
        ax.fill_between(sizes, los, his, color=color, alpha=0.2, lw=0)
        at_target = maps[int(np.searchsorted(sizes, gallery_size))]
        ax.plot([gallery_size], [at_target], "o", color=color, ms=6)
        ax.annotate(
            f"{at_target:.3f}",
            (gallery_size, at_target),
            textcoords="offset points",
            xytext=(6, 4),
            color=color,
            fontsize=9,
        )
        data["curves"][name] = {"map": maps, "ci_low": los, "ci_high": his}
    if measured:
        xs = [m["sample_size"] for m in measured]
        ys = [m["map"] for m in measured]
        err = np.array(
            [[m["map"] - m["ci"][0] for m in measured], [m["ci"][1] - m["map"] for m in measured]]
        )
        ax.errorbar(
            xs,
            ys,
            yerr=err,
            fmt="s",
            color="black",
            ms=5,
            capsize=3,
            label="measured on sub-samples S/8…S",
        )
    ax.axvline(gallery_size, color="tab:red", ls=":", lw=1.5)
    ax.text(
        gallery_size,
        ax.get_ylim()[1],
        f" target N = {gallery_size:,}",
        color="tab:red",
        va="top",
        fontsize=9,
    )
    ax.set_xscale("log")
    ax.set_xlabel("gallery size N (distractors)")
    ax.set_ylabel(f"mAP@{predictor.k}")
    ax.set_title(
        f"Predicted mAP@{predictor.k} vs gallery size (sample S = {S:,}, {predictor.n_queries_valid} queries)"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return data
