"""``rl-gap sweep-scarce``: the gSAP paper's scarce-data protocol as one command.

For every recipe (one per loss), every ρ in ``--images-per-class`` (default
2 4) and every γ in ``--fractions`` (percent of the eligible training classes,
default 1 5 10 25 50 100), train with ``--num-seeds`` seeds (default 3); each
seed draws its own subset (``data.class_fraction``, ``data.images_per_class``,
``data.seed``; see ``rl_gap.data.subsets``) and evaluates on the full test
split: every run gets ``data.val_split 0``, so a recipe that validates on
held-out training classes (``val_split: 0.3``) still reports the test split and
γ is a share of all its training classes. Prints and writes the γ × ρ × loss table of gAP and mAP (mean ± std
over seeds, %): ``scarce.csv`` (every metric, one row per setting),
``scarce.md``, and ``scarce_runs.csv`` (one row per run), in ``--output``
(default ``runs/scarce``).

A subset trains with ``m = min(m_per_class, ρ)`` images per class in a batch
and at most as many classes per batch as it holds; set
``--overrides "--data.init_args.batches_per_epoch N"`` to give every setting
the same number of steps (by default an epoch is one pass over the subset).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rl_gap.experiments.grid import Setting, add_grid_arguments, on_test_split, sweep
from rl_gap.experiments.runner import data_accepts, recipe_loss
from rl_gap.experiments.tables import (
    RANKING_RULE,
    pivot_table,
    ranking_lines,
    settings_metrics_table,
)

DEMO_RECIPES = [f"recipes/demo/mnist_{loss}.yaml" for loss in ("gsap", "msap", "infonce")]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_grid_arguments(parser, DEMO_RECIPES)
    parser.add_argument(
        "--fractions", type=float, nargs="+", default=[1, 5, 10, 25, 50, 100],
        help="γ: percent of the eligible training classes kept",
    )  # fmt: skip
    parser.add_argument(
        "--images-per-class", type=int, nargs="+", default=[2, 4], help="ρ: images per class"
    )
    parser.add_argument("--name", default="scarce", help="W&B group")


def settings(args: argparse.Namespace) -> list[Setting]:
    out = []
    for recipe in args.recipes:
        if not data_accepts(recipe, "class_fraction"):
            raise ValueError(
                f"{recipe}: its DataModule has no class_fraction/images_per_class "
                "(a rl_gap.data.metric_learning DataModule is needed)"
            )
        loss = recipe_loss(recipe)
        for rho in args.images_per_class:
            for gamma in args.fractions:
                if not 0 < gamma <= 100 or rho < 1:
                    raise ValueError(f"need 0 < γ <= 100 and ρ >= 1, got γ={gamma}, ρ={rho}")
                overrides = (*on_test_split(recipe),
                             "--data.init_args.class_fraction", repr(gamma / 100),
                             "--data.init_args.images_per_class", str(rho))  # fmt: skip
                out.append(
                    Setting(
                        {"loss": loss, "rho": rho, "gamma": gamma},
                        recipe,
                        overrides,
                        f"{loss}/rho_{rho}/gamma_{gamma:g}",
                    )  # fmt: skip
                )
    return out


def run(args: argparse.Namespace) -> int:
    out = Path(args.output or "runs/scarce").resolve()
    by = ["loss", "rho", "gamma"]
    agg, seconds = sweep(args, settings(args), out, "scarce", args.name, by)
    tables = [
        f"gAP (%), mean ± std over {args.num_seeds} seeds:\n\n"
        + pivot_table(agg, ["rho", "gamma"], "loss", "gAP"),
        "mAP (%):\n\n" + pivot_table(agg, ["rho", "gamma"], "loss", "mAP"),
        "all metrics:\n\n" + settings_metrics_table(agg, by),
    ]
    tables.append(
        "\n".join(
            [
                f"ranking rule: {RANKING_RULE}.",
                *ranking_lines(agg, ("gAP", "mAP"), label="loss", group_by=["rho", "gamma"]),
            ]
        )
    )
    text = "\n\n".join(tables)
    (out / "scarce.md").write_text(
        "# rl-gap sweep-scarce\n\nγ: % of eligible training classes kept, ρ: images per "
        f"class.\n\n{text}\n"
    )
    print(f"\n{text}\n\nwall time {seconds:.0f} s; tables: {out / 'scarce.csv'}, "
          f"{out / 'scarce.md'}")  # fmt: skip
    return 0
