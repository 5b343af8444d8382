"""One seed is not a ranking: the demo runs seeds, and every table names a best loss
only where its lead exceeds the spread (``rl_gap.experiments.tables.leader``).

Rule: best = the highest mean, if against every other row the lead of means is
larger than the sum of the two sample stds (ddof=1) and each row has >= 2 seeds;
else tied. References: hand-made tables with numpy's mean / std(ddof=1).
"""

from __future__ import annotations

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


def _runs():
    values = {  # loss -> gAP of seeds 0, 1, 2; mAP equal for all losses
        "gsap": [0.600, 0.612, 0.588],
        "msap": [0.599, 0.611, 0.587],
        "infonce": [0.400, 0.410, 0.390],
    }
    runs = []
    for loss, gaps in values.items():
        for seed, gap in enumerate(gaps):
            metrics = {m: 0.5 for m in demo.METRICS}
            metrics["gAP"] = gap
            runs.append({"loss": loss, "seed": seed, **metrics})
    return values, runs


def test_demo_table_prints_mean_std_and_ties():
    values, runs = _runs()
    text = demo.format_table(runs, {"gsap": 10.0, "msap": 11.0, "infonce": 9.0}, 3)
    for gaps in values.values():
        mean, std = 100 * np.mean(gaps), 100 * np.std(gaps, ddof=1)
        assert f"{mean:.2f} ± {std:.2f}" in text
    gap_line = next(line for line in text.splitlines() if line.startswith("gAP:"))
    assert "tied on this demo" in gap_line and "gsap vs msap" in gap_line
    map_line = next(line for line in text.splitlines() if line.startswith("mAP:"))
    assert "tied on this demo" in map_line
    assert "best gAP" not in text


def test_demo_runs_three_seeds_per_loss_by_default(monkeypatch, capsys):
    calls = []

    def fake_train_one(loss, output_dir, epochs, extra, seed=0):
        calls.append((loss, seed))
        return {"val/gap": {"gsap": 0.9, "msap": 0.5, "infonce": 0.1}[loss] + 0.001 * seed}

    monkeypatch.setattr(demo, "train_one", fake_train_one)
    assert demo.main([]) == 0
    assert calls == [(loss, seed) for loss in demo.LOSSES for seed in range(3)]
    out = capsys.readouterr().out
    assert "gAP: best gsap" in out
    with pytest.raises(SystemExit):
        demo.main(["--seeds", "0"])
