"""The tables ``research/validate_tail.py`` prints from its rows.

A row is one (world, seed): the truth, and per estimator a cell with its error,
interval, coverage and time; with ``--resamples`` the errors on every
independent sample (``resample_errs``), with ``--by-count`` the error split by
sampled count, with ``--half-check`` the out-of-sample checks of each sample, half against
half and sample against pool (``research.tail_check``).
"""

from __future__ import annotations

import argparse

import numpy as np

#: Groups of positives by the number K_S of sampled distractors scoring above them.
COUNT_GROUPS = (("K_S=0", 0, 1), ("K_S=1-4", 1, 5), ("K_S>=5", 5, None))


def print_table(rows: list[dict], estimators: tuple[str, ...], args: argparse.Namespace) -> None:
    """One seed's estimator × world table: error, coverage, joint coverage, time."""
    print(
        f"\nmAP@{args.k}: predicted at N = {args.pool:,} from a {args.rate:.0%} sample "
        f"(S ≈ {int(args.rate * args.pool):,}, {1 / args.rate:.0f}× extrapolation), "
        f"{args.queries} queries, seed {args.seed}"
    )
    print(
        "cell: error (+ = over-prediction), * = 95% query-bootstrap interval misses the truth; "
        "joint = cells covered by the queries × distractors interval (--nested-boot)"
    )
    head = f"{'estimator':<12}" + "".join(f"{r['world']:>16}" for r in rows)
    print(head + f"{'mean |err|':>12}{'covered':>9}{'joint':>7}{'time/world':>12}")
    print(f"{'truth':<12}" + "".join(f"{r['truth']:>16.4f}" for r in rows))
    for name in estimators:
        cells = "".join(
            f"{r[name]['err']:>+15.4f}{' ' if r[name]['covered'] else '*'}" for r in rows
        )
        mae = np.mean([abs(r[name]["err"]) for r in rows])
        cover = sum(r[name]["covered"] for r in rows)
        secs = np.mean([r[name]["seconds"] for r in rows])
        print(
            f"{name:<12}{cells}{mae:>12.4f}{cover:>6d}/{len(rows)}{joint_cover(rows, name):>7}{secs:>11.2f}s"
        )


def joint_cover(rows: list[dict], name: str) -> str:
    """'c/n' cells covered by the joint interval, or '-' where none was computed."""
    cells = [r[name]["nested_covered"] for r in rows if "nested_covered" in r[name]]
    return f"{sum(cells)}/{len(cells)}" if cells else "-"


def print_summary(rows: list[dict], estimators: tuple[str, ...], seeds: list[int]) -> None:
    """Mean |err| per world over the seeds, and over every (world, seed) cell."""
    worlds = list(dict.fromkeys(r["world"] for r in rows))
    print(f"\nsummary over seeds {', '.join(map(str, seeds))}: mean |err| per world; covered cells")
    print(
        f"{'estimator':<12}"
        + "".join(f"{w:>16}" for w in worlds)
        + f"{'mean |err|':>12}{'covered':>9}{'joint':>7}"
    )
    for name in estimators:
        cells = []
        for w in worlds:
            errs = [abs(r[name]["err"]) for r in rows if r["world"] == w]
            cells.append(f"{np.mean(errs):>16.4f}")
        mae = np.mean([abs(r[name]["err"]) for r in rows])
        cover = sum(r[name]["covered"] for r in rows)
        print(
            f"{name:<12}{''.join(cells)}{mae:>12.4f}{cover:>6d}/{len(rows)}{joint_cover(rows, name):>7}"
        )


def bias_and_noise(rows: list[dict], name: str, world: str) -> dict:
    """An estimator's errors on a world over every seed's independent samples.

    ``bias``: the mean error over all (seed, sample) cells; ``sd``: the spread
    over independent samples of one pool (the within-seed variance, pooled over
    seeds), which no estimator fed that sample can see; ``mean_abs``: mean
    |err|; ``held_out``: mean |err| over samples 1.. only (sample 0 is the one
    the default table reports, the one estimators were chosen on);
    ``covered``: cells whose 95% query-bootstrap interval holds the truth;
    ``joint``: per seed, the samples whose joint interval holds it (``--nested-boot``).
    """
    cells = [r[name] for r in rows if r["world"] == world]
    errs = [np.asarray(c["resample_errs"]) for c in cells]
    every = np.concatenate(errs)
    return {
        "bias": float(every.mean()),
        "sd": float(np.sqrt(np.mean([e.var(ddof=1) for e in errs]))),
        "mean_abs": float(np.abs(every).mean()),
        "held_out": float(np.abs(np.concatenate([e[1:] for e in errs])).mean()),
        "covered": sum(sum(c.get("resample_covered", [])) for c in cells),
        "joint": [
            sum(c["resample_nested_covered"]) for c in cells if "resample_nested_covered" in c
        ],
        "cells": every.size,
    }


def print_bias_and_noise(rows: list[dict], estimators: tuple[str, ...], args) -> None:
    """Per estimator × world: bias / sample-noise sd over ``--resamples`` samples per pool."""
    worlds = list(dict.fromkeys(r["world"] for r in rows))
    seeds = sorted({r["seed"] for r in rows})
    print(
        f"\nbias/noise sd over {args.resamples} independent {args.rate:.0%} samples of each pool "
        f"(seeds {', '.join(map(str, seeds))}). E|err|: mean |err| over every sample; held-out: "
        "over samples 1.. only (not sample 0, which the tables above use); floor: mean over "
        "worlds of E|err| of an unbiased normal estimator with that noise (sd·sqrt(2/π)); "
        "covered: cells whose 95% query-bootstrap interval holds the truth; joint: the same for "
        "the joint interval (--nested-boot)"
    )
    print(
        f"{'estimator':<12}"
        + "".join(f"{w:>16}" for w in worlds)
        + f"{'E|err|':>9}{'held-out':>9}{'|bias|':>9}{'floor':>9}{'covered':>9}{'joint':>9}"
    )
    for name in estimators:
        stats = [bias_and_noise(rows, name, w) for w in worlds]
        cells = "".join(f"{s['bias']:>+9.4f}/{s['sd']:.4f}" for s in stats)
        mean_abs = np.mean([s["mean_abs"] for s in stats])
        held_out = np.mean([s["held_out"] for s in stats])
        mean_bias = np.mean([abs(s["bias"]) for s in stats])
        floor = np.mean([s["sd"] * np.sqrt(2 / np.pi) for s in stats])
        n_cells = sum(s["cells"] for s in stats)
        covered = f"{sum(s['covered'] for s in stats)}/{n_cells}"
        joint = [n for s in stats for n in s["joint"]]
        joint = f"{sum(joint)}/{n_cells}" if len(joint) == len(rows) else "-"
        print(
            f"{name:<12}{cells}{mean_abs:>9.4f}{held_out:>9.4f}{mean_bias:>9.4f}{floor:>9.4f}"
            f"{covered:>9}{joint:>9}"
        )


def print_held_out_by_count(rows: list[dict], estimators: tuple[str, ...]) -> None:
    """Per estimator × world: each K_S group's error, averaged over the held-out samples 1.."""
    worlds = list(dict.fromkeys(r["world"] for r in rows))
    groups = [g for g, _, _ in COUNT_GROUPS]
    print("\nerror by sampled count K_S, mean over the held-out samples (1..) of every seed")
    print(f"{'estimator':<12}{'group':<9}" + "".join(f"{w:>16}" for w in worlds))
    for name in estimators:
        if not any("resample_by_count" in r.get(name, {}) for r in rows):
            continue
        for g in groups:
            means = []
            for w in worlds:
                errs = [
                    parts[g]["err"]
                    for r in rows
                    if r["world"] == w and "resample_by_count" in r[name]
                    for parts in r[name]["resample_by_count"][1:]
                ]
                means.append(f"{np.mean(errs):>+16.4f}" if errs else f"{'-':>16}")
            print(f"{name:<12}{g:<9}" + "".join(means))


def format_tail_check(check: dict) -> str:
    """Per band of ρ̄: actual / predicted counts of the part not fitted (ratio, positives)."""
    edges = check["edges"]
    labels = [f"<{edges[0]:g}"] + [f"{a:g}-{b:g}" for a, b in zip(edges, edges[1:])]
    labels.append(f">={edges[-1]:g}")
    parts = []
    for label, n, pred, act in zip(labels, check["positives"], check["predicted"], check["actual"]):
        ratio = f"x{act / pred:.2f}" if pred > 0 else "x-"
        parts.append(f"rho {label}: {act:.0f}/{pred:.1f} {ratio} ({n})")
    return "  ".join(parts)
