"""Edges the tail checks must keep: scores past the top of ``score_range`` alone are refused
(not only past the bottom), and ``n_boot = 0`` means no interval (never an empty quantile)."""

from __future__ import annotations

import pytest
import torch

from rl_gap.metrics.tail.hardness import RANGE_TOLERANCE, clip_to_range
from rl_gap.metrics.tail.intervals import bootstrap_ci, check_n_boot, percentile_interval


def test_scores_above_the_top_only_are_refused():
    # every score inside [-1, 1] from below; one past the top by more than the tolerance
    top = 1.0 + 2 * RANGE_TOLERANCE
    with pytest.raises(ValueError, match=r"reach \[-0\.5, 1\.02\], outside the declared"):
        clip_to_range(torch.tensor([-0.5, 0.2, top]), (-1.0, 1.0), "scores")
    with pytest.raises(ValueError, match=r"reach \[-1\.02, 0\.5\], outside the declared"):
        clip_to_range(torch.tensor([-top, 0.2, 0.5]), (-1.0, 1.0), "scores")
    # rounding overshoot within the tolerance is clipped to the range
    got = clip_to_range(torch.tensor([0.2, 1.0 + RANGE_TOLERANCE / 2]), (-1.0, 1.0), "scores")
    assert got.tolist() == [pytest.approx(0.2), 1.0]


def test_n_boot_zero_is_no_interval():
    assert bootstrap_ci(torch.tensor([0.1, 0.2, 0.3]), n_boot=0) is None
    check_n_boot(0)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="n_boot must be an integer >= 0"):
            check_n_boot(bad)
    with pytest.raises(ValueError, match=r"no bootstrap replicate .*n_boot = 0"):
        percentile_interval(torch.empty(0))
