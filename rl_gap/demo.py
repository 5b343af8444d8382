"""``make demo``: train the MNIST metric-learning demo with gSAP, mSAP and InfoNCE, print one table.

Each loss runs its recipe ``recipes/demo/mnist_<loss>.yaml`` through the same
``rl-gap fit`` CLI a researcher uses (CPU, a few epochs, digits 0-4 for
training, unseen digits 5-9 for evaluation), then the table lists, per loss:
gAP, mAP, R@1 over all test queries and the threshold protocol of the gSAP
paper (§C.3: shared thresholds fitted on half of the test digits, reported on
the other half): R@P90, F1g (F1 at the shared threshold), F1q (mean per-query
best F1).

    python -m rl_gap.demo [--losses gsap msap infonce] [--epochs N] [--output_dir runs]
"""

from __future__ import annotations

import argparse
import time

from rl_gap.resources import recipe_path

LOSSES = ("gsap", "msap", "infonce")
COLUMNS = {
    "gAP": "val/gap",
    "mAP": "val/map",
    "R@1": "val/r@1",
    "R@P90": "val/protocol_r@p90",
    "F1g": "val/protocol_f1g",
    "F1q": "val/protocol_f1q",
}


def train_one(loss: str, output_dir: str, epochs: int | None, extra: list[str]) -> dict[str, float]:
    """Run ``rl-gap fit`` on the loss's demo recipe; return its final validation metrics."""
    from rl_gap.training.cli import run_lightning_cli

    recipe = recipe_path(f"demo/mnist_{loss}")  # shipped in the package (rl_gap.resources)
    argv = ["fit", "--config", str(recipe), "--output_dir", output_dir]
    if epochs is not None:
        argv += [
            "--trainer.max_epochs",
            str(epochs),
            "--trainer.check_val_every_n_epoch",
            str(epochs),
        ]
    cli = run_lightning_cli(argv + extra)
    return {k: float(v) for k, v in cli.trainer.callback_metrics.items()}


def format_table(results: dict[str, dict[str, float]], seconds: dict[str, float]) -> str:
    """Loss x (gAP, mAP, R@1, R@P90, F1g, F1q) as a fixed-width text table (percent)."""
    header = f"{'loss':<9}" + "".join(f"{c:>8}" for c in COLUMNS) + f"{'time':>9}"
    lines = [header, "-" * len(header)]
    for loss, metrics in results.items():
        cells = "".join(f"{100 * metrics.get(key, float('nan')):>8.2f}" for key in COLUMNS.values())
        lines.append(f"{loss:<9}{cells}{seconds[loss]:>8.0f}s")
    best = max(results, key=lambda k: results[k].get("val/gap", float("-inf")))
    lines.append("")
    lines.append(
        "test digits 5-9 (unseen in training), every image a query against the other 2,499; "
        "R@P90/F1g/F1q: thresholds fitted on half of the test digits, reported on the other half."
    )
    lines.append(f"best gAP: {best}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rl_gap.demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    parser.add_argument("--epochs", type=int, default=None, help="override the recipes' max_epochs")
    parser.add_argument(
        "--output_dir",
        default="runs",
        help="runs go to <output_dir>/demo/mnist_<loss>/seed<N>[-<overrides hash>]",
    )
    args, extra = parser.parse_known_args(argv)
    results, seconds = {}, {}
    for loss in args.losses:
        start = time.perf_counter()
        results[loss] = train_one(loss, args.output_dir, args.epochs, extra)
        seconds[loss] = time.perf_counter() - start
    print("\nMNIST metric-learning demo (rl_gap), metrics in %:\n")
    print(format_table(results, seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
