"""Paired verdicts (``rl_gap.experiments.tables.paired_verdict``) against hand-computed values.

Runs of two losses with the same seed are paired: differences a − b per seed, their mean ±
std (ddof=1), wins out of n, paired t = mean / (std / √n) with a two-sided Student-t p, and
the two-sided exact sign test. References are worked out by hand below (and the t p-value
with the closed form of the t distribution for 2 degrees of freedom,
P(|T| > t) = 1 − t / √(2 + t²)).
"""

from __future__ import annotations

import math

import pytest

from rl_gap.experiments.tables import (
    paired_t,
    paired_verdict,
    paired_verdicts,
    sign_test_p,
)


def _rows(values: dict[str, list[float]], metric: str = "gAP") -> list[dict]:
    return [{"loss": loss, "seed": s, metric: v} for loss, vs in values.items()
            for s, v in enumerate(vs)]  # fmt: skip


def test_three_seeds_by_hand():
    # diffs 0.05, 0.02, 0.05: mean 0.04, std sqrt((1e-4 + 4e-4 + 1e-4) / 2) = sqrt(3e-4),
    # t = 0.04 / (sqrt(3e-4) / sqrt(3)) = 0.04 / 0.01 = 4.0, p (2 dof) = 1 - 4 / sqrt(18)
    rows = _rows({"gsap": [0.50, 0.60, 0.55], "msap": [0.45, 0.58, 0.50]})
    v = paired_verdict(rows, "gAP", "gsap", "msap")
    assert v.seeds == (0, 1, 2) and v.n == 3
    assert v.diffs == pytest.approx((0.05, 0.02, 0.05), abs=1e-12)
    assert v.mean == pytest.approx(0.04, abs=1e-12)
    assert v.std == pytest.approx(math.sqrt(3e-4), rel=1e-9)
    assert (v.wins, v.losses) == (3, 0)
    assert v.t == pytest.approx(4.0, rel=1e-9)
    assert v.p_t == pytest.approx(1 - 4 / math.sqrt(18), rel=1e-9)
    assert v.p_sign == pytest.approx(2 / 8)  # 3 of 3: 2 · (1/2)³
    assert v.line() == (
        "gAP: gsap ahead of msap in 3/3 seeds, +4.00 ± 1.73 points "
        "(paired t = 4.00, p = 0.057; sign test p = 0.25)"
    )


def test_a_behind_in_some_seeds_and_a_tie():
    # diffs +0.1, -0.1, 0, +0.3: wins 2, losses 1 (the tie dropped: sign test on 3 seeds,
    # min(2, 1) = 1: p = 2 · (C(3,0) + C(3,1)) / 8 = 1.0); mean 0.075
    rows = _rows({"a": [0.5, 0.4, 0.3, 0.9], "b": [0.4, 0.5, 0.3, 0.6]})
    v = paired_verdict(rows, "gAP", "a", "b")
    assert (v.wins, v.losses, v.n) == (2, 1, 4)
    assert v.mean == pytest.approx(0.075)
    assert v.p_sign == 1.0
    # std of (0.1, -0.1, 0, 0.3): deviations 0.025, -0.175, -0.075, 0.225 -> ss 0.0875, /3
    assert v.std == pytest.approx(math.sqrt(0.0875 / 3))
    assert "a ahead of b in 2/4 seeds, tied in 1" in v.line()


def test_sign_test_by_hand():
    assert sign_test_p(5, 0) == pytest.approx(2 / 32)
    assert sign_test_p(4, 1) == pytest.approx(2 * 6 / 32)
    assert sign_test_p(0, 5) == pytest.approx(2 / 32)
    assert sign_test_p(3, 3) == 1.0
    assert sign_test_p(0, 0) == 1.0
    assert sign_test_p(10, 0) == pytest.approx(2 / 1024)


def test_paired_t_edge_cases():
    assert all(math.isnan(x) for x in paired_t([0.3]))
    assert paired_t([0.25, 0.25, 0.25]) == (math.inf, 0.0)  # every seed the same gain
    assert paired_t([0.0, 0.0]) == (0.0, 1.0)
    # 2 values: t = mean / (std / sqrt 2); diffs 1, 3: mean 2, std sqrt 2, t = 2;
    # 1 dof: P(|T| > t) = 1 - 2 atan(t) / pi
    t, p = paired_t([1.0, 3.0])
    assert t == pytest.approx(2.0) and p == pytest.approx(1 - 2 * math.atan(2.0) / math.pi)


def test_only_common_seeds_are_paired_and_duplicates_refused():
    rows = _rows({"a": [0.5, 0.6, 0.7], "b": [0.4, 0.5]})
    v = paired_verdict(rows, "gAP", "a", "b")
    assert v.seeds == (0, 1) and v.diffs == pytest.approx((0.1, 0.1))
    with pytest.raises(ValueError, match="no seed in common"):
        paired_verdict(rows + [{"loss": "c", "seed": 9, "gAP": 0.1}], "gAP", "a", "c")
    with pytest.raises(ValueError, match="two runs of loss=a with seed=0"):
        paired_verdict(rows + [{"loss": "a", "seed": 0, "gAP": 0.1}], "gAP", "a", "b")


def test_every_pair_first_minus_later():
    rows = _rows({"gsap": [0.6, 0.7], "msap": [0.5, 0.6], "infonce": [0.4, 0.55]})
    pairs = [(v.a, v.b, v.metric) for v in paired_verdicts(rows, ("gAP",))]
    assert pairs == [("gsap", "msap", "gAP"), ("gsap", "infonce", "gAP"),
                     ("msap", "infonce", "gAP")]  # fmt: skip
    lines = [v.line() for v in paired_verdicts(rows, ("gAP",))]
    assert lines[1].startswith("gAP: gsap ahead of infonce in 2/2 seeds, +17.50 ± 3.54 points")
