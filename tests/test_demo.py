"""One seed is not a ranking: the demo runs seeds, and every table names a best loss
only where its lead exceeds the spread (``rl_gap.experiments.tables.leader``).

Rule: best = the highest mean, if against every other row the lead of means is
larger than the sum of the two sample stds (ddof=1) and each row has >= 2 seeds;
else tied. References: hand-made tables with numpy's mean / std(ddof=1).
"""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest

from rl_gap import demo
from rl_gap.experiments.tables import leader, ranking_lines


def _row(loss, values, metric="gAP", **settings):
    values = np.asarray(values, dtype=np.float64)
    std = float(values.std(ddof=1)) if values.size > 1 else 0.0
    return {"loss": loss, **settings, f"{metric}_mean": float(values.mean()),
            f"{metric}_std": std, "n": int(values.size)}  # fmt: skip


def test_clear_lead_names_the_best():
    rows = [_row("gsap", [0.60, 0.61, 0.59]), _row("msap", [0.55, 0.56, 0.54]),
            _row("infonce", [0.50, 0.52, 0.48])]  # fmt: skip
    best, why = leader(rows, "gAP")
    assert best == "gsap"
    # lead over msap 5.00 points, spread 1 + 1 = 2.00 points (the tightest comparison)
    assert "lead 5.00 > spread 2.00 points over msap" in why


def test_lead_inside_the_spread_is_a_tie():
    # the case: a 0.04-point lead with seed-to-seed spread of about a point
    rows = [_row("gsap", [0.6104, 0.6004, 0.5904]), _row("msap", [0.6100, 0.6000, 0.5900])]
    assert leader(rows, "gAP")[0] is None


def test_every_other_row_must_be_beaten_not_only_the_runner_up():
    rows = [_row("gsap", [0.600, 0.601, 0.599]), _row("infonce", [0.62, 0.57, 0.52]),
            _row("msap", [0.590, 0.591, 0.589])]  # fmt: skip
    # means 60.0 > 59.0 (msap, the runner-up) > 57.0 (infonce): gsap beats msap by
    # 1.0 > 0.2 points, but its 3-point lead over infonce is inside 0.1 + 5.0 points.
    best, why = leader(rows, "gAP")
    assert best is None and "infonce" in why


def test_lead_equal_to_the_spread_is_a_tie():
    # values exact in binary: lead 0.5, spread 0.25 + 0.25 = 0.5, not larger
    rows = [_row("a", [1.0, 0.75, 0.5]), _row("b", [0.5, 0.25, 0.0])]
    assert leader(rows, "gAP")[0] is None
    rows[1] = _row("b", [0.49, 0.24, -0.01])
    assert leader(rows, "gAP")[0] == "a"


def test_one_seed_never_ranks():
    rows = [_row("gsap", [0.70]), _row("msap", [0.40])]
    best, why = leader(rows, "gAP")
    assert best is None and "one seed" in why


def test_ranking_lines_per_setting():
    rows = [_row("gsap", [0.6, 0.61, 0.59], rho=2), _row("msap", [0.5, 0.51, 0.49], rho=2),
            _row("gsap", [0.6, 0.61, 0.59], rho=4), _row("msap", [0.6, 0.62, 0.58], rho=4)]  # fmt: skip
    lines = ranking_lines(rows, ("gAP",), group_by=["rho"], scope="this sweep")
    assert lines[0].startswith("rho=2: gAP: best gsap")
    assert lines[1].startswith("rho=4: gAP: tied on this sweep")


def test_demo_defaults_to_the_glyph_comparison(monkeypatch, capsys):
    import rl_gap.experiments.compare as engine

    seen = {}

    def fake_compare(plan, runner, progress=None):
        seen["plan"], seen["runner"] = plan, runner
        return engine.Result([], [], {}, [], "TABLE", 1.0)

    monkeypatch.setattr(engine, "compare", fake_compare)
    assert demo.main(["--output_dir", "somewhere"]) == 0
    plan = seen["plan"]
    assert plan.recipe.endswith("recipes/demo/glyph_classes.yaml")
    assert list(plan.losses) == ["gsap", "msap", "infonce"] and list(plan.seeds) == [0, 1, 2, 3, 4]
    assert plan.tau_grid is None and "--tau-grid" in plan.tau_source  # τ from the recipe, said so
    assert (plan.workers, plan.threads) == (min(2, os.cpu_count() or 1), 1)
    assert "TABLE" in capsys.readouterr().out
    assert demo.main(["--task", "mnist", "--epochs", "2"]) == 0
    plan = seen["plan"]
    assert plan.recipe.endswith("recipes/demo/mnist_gsap.yaml") and list(plan.seeds) == [0, 1, 2]
    assert seen["runner"].overrides[-4:] == [
        "--trainer.max_epochs",
        "2",
        "--trainer.check_val_every_n_epoch",
        "2",
    ]
    with pytest.raises(SystemExit):
        demo.main(["--seeds", "0"])


TINY = [
    "--data.init_args.train_classes", "16", "--data.init_args.test_classes", "8",
    "--data.init_args.train_renders", "4", "--data.init_args.test_renders", "3",
    "--data.init_args.canvas", "16", "--data.init_args.batch_size", "16",
    "--data.init_args.batches_per_epoch", "3", "--model.init_args.backbone_kwargs", "{width: 4}",
    "--model.init_args.dim", "8",
]  # fmt: skip


def test_tiny_glyph_demo_prints_table_and_paired_verdicts(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    argv = ["--losses", "gsap", "infonce", "--seeds", "2", "--jobs", "1",
            "--output_dir", str(tmp_path), *TINY]  # fmt: skip
    assert demo.main(argv) == 0
    out = capsys.readouterr().out
    with (tmp_path / "demo" / "glyphs" / "runs.csv").open() as f:
        runs = list(csv.DictReader(f))
    assert [(r["loss"], r["seed"]) for r in runs] == [
        ("gsap", "0"),
        ("gsap", "1"),
        ("infonce", "0"),
        ("infonce", "1"),
    ]
    for loss in ("gsap", "infonce"):  # the table: numpy mean ± std (ddof=1) of the runs
        for metric in ("gAP", "C", "gAP/C"):
            values = 100 * np.array([float(r[metric]) for r in runs if r["loss"] == loss])
            assert f"{values.mean():.2f} ± {values.std(ddof=1):.2f}" in out
    diffs = [float(runs[i]["gAP"]) - float(runs[i + 2]["gAP"]) for i in (0, 1)]
    wins = sum(d > 0 for d in diffs)
    assert (f"gAP: gsap ahead of infonce in {wins}/2 seeds, {100 * np.mean(diffs):+.2f} ± "
            f"{100 * np.std(diffs, ddof=1):.2f} points") in out  # fmt: skip
    assert "| loss | τ | gAP (%)" in out and "| gsap | 0.1 |" in out
