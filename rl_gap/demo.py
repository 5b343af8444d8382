"""``make demo``: train the MNIST metric-learning demo with gSAP, mSAP and InfoNCE over seeds.

Each loss runs its recipe ``recipes/demo/mnist_<loss>.yaml`` through the same
``rl-gap fit`` CLI a researcher uses (CPU, a few epochs, digits 0-4 for
training, unseen digits 5-9 for evaluation), once per seed (3 by default).
The table lists, per loss, mean ± std over the seeds (sample std, ddof=1) of
gAP, mAP, R@1 over all test queries and the threshold protocol of the gSAP
paper (§C.3: shared thresholds fitted on half of the test digits, reported on
the other half): R@P90, F1g (F1 at the shared threshold), F1q (mean per-query
best F1). Under it, per metric, a best loss is named only where its lead of
means over every other loss exceeds the sum of their two stds; otherwise the
losses are tied on this demo (``rl_gap.experiments.tables.leader``).

    python -m rl_gap.demo [--losses gsap msap infonce] [--seeds 3] [--epochs N] [--output_dir runs]
"""

from __future__ import annotations

import argparse
import time

from rl_gap.experiments.runner import METRICS
from rl_gap.experiments.tables import (
    RANKING_RULE,
    aggregate,
    cell,
    metric_row,
    ranking_lines,
)
from rl_gap.resources import recipe_path

LOSSES = ("gsap", "msap", "infonce")
SEEDS = 3


def train_one(
    loss: str, output_dir: str, epochs: int | None, extra: list[str], seed: int = 0
) -> dict[str, float]:
    """Run ``rl-gap fit`` on the loss's demo recipe with ``seed``; return its final metrics."""
    from rl_gap.training.cli import run_lightning_cli

    recipe = recipe_path(f"demo/mnist_{loss}")  # shipped in the package (rl_gap.resources)
    argv = ["fit", "--config", str(recipe), "--output_dir", output_dir]
    argv += ["--seed_everything", str(seed)]
    if epochs is not None:
        argv += [
            "--trainer.max_epochs",
            str(epochs),
            "--trainer.check_val_every_n_epoch",
            str(epochs),
        ]
    cli = run_lightning_cli(argv + extra)
    return {k: float(v) for k, v in cli.trainer.callback_metrics.items()}


def format_table(
    runs: list[dict[str, float | str | int]], seconds: dict[str, float], num_seeds: int
) -> str:
    """Loss x (gAP, mAP, R@1, R@P90, F1g, F1q), mean ± std in percent, and the verdicts.

    ``runs``: one row per (loss, seed) with the metrics of
    :data:`rl_gap.experiments.runner.METRICS` in [0, 1]; ``seconds``: mean wall
    time of one run per loss.
    """
    rows = aggregate(runs, ["loss"])
    width = 15
    header = f"{'loss':<9}" + "".join(f"{c:>{width}}" for c in METRICS) + f"{'time/run':>10}"
    lines = [header, "-" * len(header)]
    for row in rows:
        cells = "".join(f"{cell(row, m):>{width}}" for m in METRICS)
        lines.append(f"{row['loss']:<9}{cells}{seconds[row['loss']]:>9.0f}s")
    lines.append("")
    lines.append(
        f"mean ± std over {num_seeds} seed(s) (ddof=1). Test digits 5-9 (unseen in training), "
        "every image a query against the other 2,499; R@P90/F1g/F1q: thresholds fitted on "
        "half of the test digits, reported on the other half."
    )
    lines.append(f"ranking rule: {RANKING_RULE}.")
    lines += ranking_lines(rows, tuple(METRICS), label="loss", scope="this demo")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rl_gap.demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    parser.add_argument(
        "--seeds", type=int, default=SEEDS, help="runs per loss, seeds 0 .. N-1 (default 3)"
    )
    parser.add_argument("--epochs", type=int, default=None, help="override the recipes' max_epochs")
    parser.add_argument(
        "--output_dir",
        default="runs",
        help="runs go to <output_dir>/demo/mnist_<loss>/seed<N>[-<overrides hash>]",
    )
    args, extra = parser.parse_known_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    runs, seconds = [], {}
    for loss in args.losses:
        start = time.perf_counter()
        for seed in range(args.seeds):
            metrics = train_one(loss, args.output_dir, args.epochs, extra, seed)
            runs.append({"loss": loss, "seed": seed, **metric_row(metrics)})
        seconds[loss] = (time.perf_counter() - start) / args.seeds
    print("\nMNIST metric-learning demo (rl_gap), metrics in %:\n")
    print(format_table(runs, seconds, args.seeds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
