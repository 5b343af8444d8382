"""The per-row partial sums of the sharded losses (rl_gap/losses/sharding/rows.py), on one
gloo rank, against plain means written here."""

from __future__ import annotations

import pytest
import torch

from rl_gap.losses.sharding.rows import kept_flat, mean_over_ranks, no_positive, row_mean

from ..sap_refs import brute_drop, make_batch


def test_row_mean_is_the_mean_over_rows_with_a_positive(one_rank_group):
    sim, rel, valid = make_batch(seed=2, ties=False)
    calls = []

    def per_rows(s, r, v, has_pos):
        calls.append(has_pos.clone())
        return (s * v).sum(1)[has_pos]  # any per-row value: the row sums of valid scores

    value = row_mean(sim, rel, valid, per_rows, 0.0)
    rows = [q for q in range(sim.shape[0]) if bool((rel[q] & valid[q]).any())]
    expected = sum(float((sim[q] * valid[q]).sum()) for q in rows) / len(rows)
    assert abs(float(value) - expected) < 1e-12 and len(rows) < sim.shape[0]
    assert calls[0].tolist() == [q in rows for q in range(sim.shape[0])]


def test_row_mean_drops_each_rows_lowest_negatives(one_rank_group):
    sim, rel, valid = make_batch(seed=3, ties=True)
    seen = {}

    def per_rows(s, r, v, has_pos):
        seen["valid"] = v
        return s.new_zeros(int(has_pos.sum()))

    row_mean(sim, rel, valid, per_rows, 0.5)
    for q in range(sim.shape[0]):
        cols = [d for d in range(sim.shape[1]) if valid[q, d]]
        keep = brute_drop(list(enumerate(bool(rel[q, d]) for d in cols)),
                          [float(sim[q, d]) for d in cols], 0.5)  # fmt: skip
        assert seen["valid"][q].nonzero().squeeze(1).tolist() == [cols[i] for i in keep]


def test_kept_flat_is_the_flat_list_after_dropping(one_rank_group):
    sim, rel, valid = make_batch(seed=5, ties=True)
    scores, positive = kept_flat(sim, rel, valid, 0.4)
    flat = [(float(sim[q, d]), bool(rel[q, d])) for q in range(sim.shape[0])
            for d in range(sim.shape[1]) if valid[q, d]]  # fmt: skip
    keep = brute_drop(list(enumerate(p for _, p in flat)), [s for s, _ in flat], 0.4)
    assert scores.tolist() == [flat[i][0] for i in keep]
    assert positive.tolist() == [flat[i][1] for i in keep]


def test_no_positive_and_mean(one_rank_group):
    rel = torch.zeros(2, 3, dtype=torch.bool)
    valid = torch.ones(2, 3, dtype=torch.bool)
    assert no_positive(rel, valid)
    rel[1, 2] = True
    assert no_positive(rel, ~rel) and not no_positive(rel, valid)
    assert float(mean_over_ranks(torch.tensor(6.0), 4)) == pytest.approx(1.5)
