"""Row blocks: slices cover every row once, and joined blocks equal the one-block result."""

from __future__ import annotations

import torch

from rl_gap.metrics.tail.hardness import TailFit
from rl_gap.metrics.tail.rows import concat_rows, fill_rows, row_slices


def test_row_slices_cover_every_row_once_within_the_budget():
    assert row_slices(10, 4, block_values=100) == [slice(0, 10)]
    blocks = row_slices(10, 4, block_values=12)
    assert blocks == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 10)]
    assert row_slices(5, 1000, block_values=10) == [slice(i, i + 1) for i in range(5)]


def test_joined_blocks_equal_the_whole():
    x = torch.randn(7, 3, dtype=torch.float64)
    fit = TailFit(*(torch.arange(7.0) + i for i in range(5)))
    blocks = row_slices(7, 3, block_values=6)

    def part(rows):
        sub = TailFit(
            fit.threshold[rows], fit.sigma[rows], fit.xi[rows], fit.zeta[rows], fit.ok[rows]
        )
        return x[rows] * 2, None, sub, 11

    joined = fill_rows(7, ((rows, part(rows)) for rows in blocks))
    assert torch.equal(joined[0], x * 2) and joined[1] is None and joined[3] == 11
    assert torch.equal(joined[2].xi, fit.xi) and torch.equal(joined[2].ok, fit.ok)
    again = concat_rows([part(rows) for rows in blocks])
    assert torch.equal(again[0], x * 2) and torch.equal(again[2].sigma, fit.sigma)
