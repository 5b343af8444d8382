"""Metric options: cut-offs, precision levels, counts and block sizes are checked once,
with a one-line error naming the option; precision levels give distinct metric keys."""

from __future__ import annotations

import numpy as np
import pytest

from rl_gap.metrics.functional.arguments import (
    check_block_size,
    check_count,
    check_k,
    check_ks,
    check_precision,
    check_precisions,
    precision_tag,
)


def test_valid_values_come_back_as_python_numbers():
    assert check_k(np.int64(5)) == 5 and type(check_k(np.int64(5))) is int
    assert check_ks([1, 5, 10]) == (1, 5, 10)
    assert check_precision(1) == 1.0 and check_precisions((0.5, 0.9)) == (0.5, 0.9)
    assert check_count(0, "bootstrap") == 0
    assert check_block_size(64) == 64 and check_block_size([8, 16]) == (8, 16)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: check_k(2.0), r"k must be an integer >= 1, got 2.0 \(float\)"),
        (lambda: check_k(True), "k must be an integer"),
        (lambda: check_k(0), "k must be >= 1, got 0"),
        (lambda: check_ks("15"), "ks must be a sequence of integers"),
        (lambda: check_ks([1, 5, 1]), r"ks has duplicate values: \[1, 5, 1\]"),
        (lambda: check_precision(0.0), r"precision must be in \(0, 1\], got 0.0"),
        (lambda: check_precision(1.5), r"precision must be in \(0, 1\]"),
        (lambda: check_precision("0.9"), "precision must be a number"),
        (lambda: check_precisions([0.9, 0.9000000001]), "the same metric key twice"),
        (lambda: check_count(-1, "bootstrap samples"), "bootstrap samples must be >= 0, got -1"),
        (lambda: check_count(2.5, "bootstrap samples"), "must be an integer >= 0"),
        (lambda: check_block_size(0), "block_size must be >= 1, got 0"),
        (lambda: check_block_size((8, 8, 8)), r"integer or \(rows, columns\)"),
    ],
)
def test_bad_values_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(
    "level, tag", [(0.9, "90"), (0.5, "50"), (1.0, "100"), (0.904, "90.4"), (0.999, "99.9")]
)
def test_precision_tags_are_percentages_without_float_noise(level, tag):
    assert precision_tag(level) == tag
