"""``make demo``: gSAP against mSAP and InfoNCE, seed by seed, on a many-class CPU task.

The default task (``--task glyphs``, recipe ``recipes/demo/glyph_classes.yaml``) is
class-disjoint metric learning on glyphs rendered offline from the DejaVu fonts:
150 training characters × 16 renderings, evaluation on 150 unseen characters × 8
(every test image a query against the other 1,199). Each loss trains at its own
temperature, chosen on held-out *training* characters by ``rl-gap compare
--tau-grid`` and stored in the recipe's loss tables (``docs/reproducing.md``); seed
``s`` sets both the initialisation and the data order, so the runs of the losses are
compared seed by seed. Printed: the mean ± std table of the test split (gAP, mAP,
R@1, R@P90, F1g, F1q, the consistency ceiling C and the efficiency gAP / C) and the
paired verdicts (per-seed differences, wins out of n, paired t and sign test). Two
runs at a time, one torch thread each (``--jobs``, ``--threads``).

``--task mnist``: the quick MNIST demo (train digits 0-4, test 5-9), same output.

    python -m rl_gap.demo [--task glyphs|mnist] [--losses gsap msap infonce] [--seeds 5]
                          [--jobs 2] [--threads 1] [--output_dir runs] [rl-gap fit overrides]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

LOSSES = ("gsap", "msap", "infonce")
#: task -> (shipped recipe, default seeds, what the table reports, where each τ comes from)
TASKS = {
    "glyphs": (
        "demo/glyph_classes",
        5,
        "150 unseen test characters × 8 renderings, every image a query against the other 1,199",
        "the recipe's loss tables, chosen by `rl-gap compare --config "
        "recipes/demo/glyph_classes.yaml --losses gsap,msap,infonce --tau-grid "
        "0.005,0.01,0.02,0.05,0.1,0.2,0.5` (best validation gAP on 30% of the training characters, "
        "docs/reproducing.md)",
    ),
    "mnist": (
        "demo/mnist_gsap",
        3,
        "unseen digits 5-9, every image a query against the other 2,499",
        "the recipe's loss tables",
    ),
}
QUIET = ("--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rl_gap.demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--task", choices=tuple(TASKS), default="glyphs")
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (glyphs 5, mnist 3)")
    parser.add_argument("--epochs", type=int, default=None, help="override the recipe's max_epochs")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="runs side by side")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument(
        "--output_dir", default="runs", help="runs go to <output_dir>/demo/<task>/test/<loss>/..."
    )
    args, extra = parser.parse_known_args(argv)
    recipe_name, default_seeds, test_set, tau_source = TASKS[args.task]
    seeds = default_seeds if args.seeds is None else args.seeds
    if seeds < 1:
        parser.error(f"--seeds must be >= 1, got {seeds}")
    if args.epochs is not None:
        extra += ["--trainer.max_epochs", str(args.epochs),
                  "--trainer.check_val_every_n_epoch", str(args.epochs)]  # fmt: skip

    from rl_gap.experiments.compare import Comparison, compare
    from rl_gap.experiments.runner import Runner
    from rl_gap.resources import recipe_path

    out = (Path(args.output_dir) / "demo" / args.task).resolve()
    plan = Comparison(
        recipe=str(recipe_path(recipe_name)), losses=args.losses, seeds=list(range(seeds)),
        output=out, workers=args.jobs, threads=args.threads, extra=tuple(extra),
        tau_source=tau_source,
    )  # fmt: skip
    runner = Runner(wandb="auto", group=f"demo-{args.task}", overrides=[*QUIET, *extra])
    print(f"[demo] {args.task}: {len(args.losses)} losses × {seeds} seeds, "
          f"{args.jobs} run(s) at a time; runs in {out}", flush=True)  # fmt: skip
    result = compare(plan, runner, progress=lambda line: print(f"[demo] {line}", flush=True))
    print(f"\n{args.task} metric-learning demo (rl_gap), metrics in %, test split: {test_set}.\n")
    print(result.text)
    print(f"\nwall time {result.seconds:.0f} s ({len(result.rows)} runs); "
          f"table, runs and paired plot in {out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
