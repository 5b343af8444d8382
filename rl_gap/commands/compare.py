"""``rl-gap compare``: one recipe, several losses, seeds; mean ± std table and paired verdicts.

    rl-gap compare --config recipes/demo/glyph_classes.yaml --losses gsap,msap,infonce --seeds 5
    rl-gap compare --config R --losses gsap,infonce --tau-grid 0.005,0.01,0.02,0.05 --seeds 3 \\
        --overrides "--trainer.max_epochs 2"

Each loss trains with its own hyperparameters from the recipe's ``loss:`` tables, or
with ``--tau-grid`` at the temperature of the grid with the best validation gAP on
held-out *training* classes; every seed sets the initialisation and the data order of
every loss, so the runs are compared seed by seed. Writes ``runs.csv``, ``table.csv``,
``table.md`` (table, temperatures, paired verdicts), ``paired.png`` and, with
``--tau-grid``, ``val_runs.csv`` and ``temperatures.json`` to ``--output``; resumes a
stopped comparison (finished runs are read back, stopped ones continue from their
checkpoint). SIGTERM/Ctrl-C stops the running runs too (they save), then exits 143/130.
Details: :mod:`rl_gap.experiments.compare`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from rl_gap.experiments.compare import VERDICT_METRICS


def _floats(text: str) -> list[float]:
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None


def _names(text: str) -> list[str]:
    return [t.strip().lower() for t in text.split(",") if t.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="training recipe (path or shipped name)")
    parser.add_argument("--losses", type=_names, required=True, help="comma-separated loss names")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per loss: seed .. seed+N-1")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument(
        "--tau-grid", type=_floats, default=None,
        help="comma-separated temperatures tried per loss on held-out training classes "
        "(default: each loss's recipe value)",
    )  # fmt: skip
    parser.add_argument("--tau-seeds", type=int, default=1, help="seeds per grid value")
    parser.add_argument(
        "--val-split", type=float, default=0.3, help="training classes held out to choose τ"
    )
    parser.add_argument(
        "--metrics", type=lambda s: [t.strip() for t in s.split(",") if t.strip()],
        default=list(VERDICT_METRICS), help="metrics of the paired verdicts",
    )  # fmt: skip
    parser.add_argument(
        "--output", default=None, help="output folder (default runs/compare/<name>)"
    )
    parser.add_argument("--name", default=None, help="W&B group (default: the recipe's name)")
    parser.add_argument(
        "--overrides", default="", help='rl-gap fit overrides for every run, e.g. "--trainer.max_epochs 2"'
    )  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1, help="runs side by side (worker processes)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run")
    parser.add_argument(
        "--trial-command", default=None,
        help='run each training as a child process: this command + "fit ..." '
        '(e.g. "torchrun --nproc_per_node 8 -m rl_gap.cli"); default: in this process',
    )  # fmt: skip
    parser.add_argument(
        "--wandb", choices=("auto", "online", "offline", "off"), default="auto",
        help="W&B logging of every run, one group per comparison (auto: offline without an API key)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from rl_gap.experiments.compare import Comparison, compare, log_to_wandb
    from rl_gap.experiments.grid import RunsStopped
    from rl_gap.experiments.runner import Runner
    from rl_gap.training.signals import STOP_EXIT_CODES

    if args.seeds < 1 or args.tau_seeds < 1:
        raise ValueError(
            f"--seeds and --tau-seeds must be >= 1, got {args.seeds}, {args.tau_seeds}"
        )
    name = args.name or Path(args.config).stem
    out = Path(args.output or Path("runs") / "compare" / name).resolve()
    overrides = shlex.split(args.overrides)
    plan = Comparison(
        recipe=args.config, losses=args.losses,
        seeds=[args.seed + i for i in range(args.seeds)], output=out, tau_grid=args.tau_grid,
        tau_seeds=[args.seed + i for i in range(args.tau_seeds)], val_split=args.val_split,
        workers=args.jobs, threads=args.threads, verdict_metrics=args.metrics,
        extra=tuple(overrides),
    )  # fmt: skip
    runner = Runner(command=Runner.parse_command(args.trial_command), wandb=args.wandb,
                    group=name, overrides=overrides)  # fmt: skip
    try:
        result = compare(plan, runner, progress=lambda line: print(f"[compare] {line}", flush=True))
    except (RunsStopped, SystemExit) as stop:
        # RunsStopped: --jobs > 1 (the workers were passed a SIGTERM and waited for);
        # SystemExit 143/130: the run in this process saved and stopped
        code = 128 + stop.signum if isinstance(stop, RunsStopped) else stop.code
        if code not in STOP_EXIT_CODES:
            raise
        name = "SIGTERM" if code == 143 else "SIGINT"
        print(f"[compare] stopped by {name}: the runs in progress saved their checkpoints; "
              "run the same command again to resume", file=sys.stderr, flush=True)  # fmt: skip
        return code
    log_to_wandb(args.wandb, name, out, result)
    print(f"\n{result.text}\n\nwall time {result.seconds:.0f} s; files: {out}/"
          "{runs.csv,table.csv,table.md,paired.png}")  # fmt: skip
    return 0
