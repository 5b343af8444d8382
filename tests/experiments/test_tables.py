"""Seed aggregation and the ranking rule of the sweep tables, against hand-computed values."""

import csv
import math
import statistics

import pytest

from rl_gap.experiments.tables import aggregate, leader, markdown_table, mean_std, write_csv


@pytest.mark.parametrize("values", [[0.5], [0.1, 0.3], [0.71, 0.69, 0.74, 0.7]])
def test_mean_std_is_the_mean_and_the_sample_standard_deviation(values):
    mean, std = mean_std(values)
    assert mean == pytest.approx(statistics.fmean(values), abs=1e-15)
    want = statistics.stdev(values) if len(values) > 1 else 0.0
    assert std == pytest.approx(want, abs=1e-15)


def test_mean_std_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="no values"):
        mean_std([])


def test_aggregate_groups_seeds_in_first_seen_order():
    rows = [
        {"loss": "gsap", "seed": 0, "gAP": 0.6},
        {"loss": "msap", "seed": 0, "gAP": 0.5},
        {"loss": "gsap", "seed": 1, "gAP": 0.8},
    ]
    got = aggregate(rows, by=["loss"], metrics=["gAP"])
    assert [r["loss"] for r in got] == ["gsap", "msap"]
    assert got[0]["gAP_mean"] == pytest.approx(0.7) and got[0]["n"] == 2
    assert got[0]["gAP_std"] == pytest.approx(math.sqrt(0.02))  # (0.1² + 0.1²) / (2 - 1)
    assert got[1]["gAP_std"] == 0.0 and got[1]["n"] == 1


def _agg(loss, mean, std, n=3):
    return {"loss": loss, "gAP_mean": mean, "gAP_std": std, "n": n}


def test_a_leader_needs_a_lead_larger_than_both_spreads_against_every_row():
    rows = [_agg("gsap", 0.70, 0.01), _agg("msap", 0.65, 0.01), _agg("sap", 0.60, 0.02)]
    assert leader(rows, "gAP")[0] == "gsap"  # 0.05 > 0.02 and 0.10 > 0.03
    rows[1] = _agg("msap", 0.69, 0.01)  # lead 0.01 <= spread 0.02: a tie
    name, why = leader(rows, "gAP")
    assert name is None and "gsap vs msap" in why
    assert leader([_agg("gsap", 0.7, 0.0, n=1), _agg("msap", 0.1, 0.0, n=1)], "gAP")[0] is None


def test_markdown_table_and_csv_round_trip(tmp_path):
    assert markdown_table(["a", "b"], [[1, "x"]]) == "| a | b |\n|---|---|\n| 1 | x |"
    rows = [{"loss": "gsap", "gAP": 0.5}, {"loss": "msap", "gAP": 0.25}]
    with open(write_csv(tmp_path / "t.csv", rows), newline="") as f:
        assert [{k: v for k, v in r.items()} for r in csv.DictReader(f)] == [
            {"loss": "gsap", "gAP": "0.5"},
            {"loss": "msap", "gAP": "0.25"},
        ]
