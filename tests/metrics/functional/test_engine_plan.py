"""``plan_problem``: the sorted problem holds exactly the caller's positive pairs."""

from __future__ import annotations

import pytest
import torch

from rl_gap.metrics.functional.engine_plan import block_bounds, plan_problem


def _pairs_in_caller_order(plan) -> set[tuple[int, int]]:
    d_row = plan.pos_d if plan.d_order is None else plan.d_order[plan.pos_d]
    return set(zip(plan.perm_q[plan.pos_q].tolist(), d_row.tolist()))


def _brute_pairs(q_lab, d_lab, self_index=None) -> set[tuple[int, int]]:
    return {
        (q, d)
        for q in range(len(q_lab))
        for d in range(len(d_lab))
        if q_lab[q] == d_lab[d] and (self_index is None or d != self_index[q])
    }


def test_block_bounds_cover_the_range_once():
    assert block_bounds(7, 3) == [(0, 3), (3, 6), (6, 7)]
    assert block_bounds(6, 3) == [(0, 3), (3, 6)]


def test_label_pairs_and_self_pairs_match_brute_force():
    g = torch.Generator().manual_seed(0)
    db = torch.randn(23, 4, generator=g)
    d_lab = torch.randint(0, 5, (23,), generator=g)
    index = torch.randperm(23, generator=g)[:9]
    plan = plan_problem(db[index], db, d_lab[index], d_lab, query_index=index, block_size=(4, 5))
    assert _pairs_in_caller_order(plan) == _brute_pairs(d_lab[index], d_lab, index)
    # sorted queries read their own rows; the self column is the query's database row
    assert torch.equal(plan.q_source, plan.perm_q)
    assert torch.equal(plan.d_order[plan.self_col], index[plan.perm_q])
    assert (plan.rows_step, plan.cols_step, plan.symmetric) == (4, 5, False)


def test_leave_one_out_is_symmetric_only_when_scores_are():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(10, 3, generator=g)
    lab = torch.randint(0, 3, (10,), generator=g)
    plan = plan_problem(x, None, lab, exclude_self=True, block_size=4)
    assert plan.symmetric
    assert _pairs_in_caller_order(plan) == _brute_pairs(lab, lab, torch.arange(10))
    offsets = torch.zeros(10)
    assert not plan_problem(x, None, lab, exclude_self=True, query_offsets=offsets).symmetric
    assert not plan_problem(x, None, lab, exclude_self=True, block_size=(4, 5)).symmetric
    assert not plan_problem(x, x.clone(), lab, lab, exclude_self=True).symmetric


def test_row_subsets_and_explicit_pairs():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(12, 3, generator=g)
    rows = torch.tensor([5, 1, 7, 3])
    plan = plan_problem(
        x, x, relevant_pairs=(torch.tensor([0, 2, 2]), torch.tensor([1, 0, 1])),
        query_rows=rows, database_rows=rows,
    )  # fmt: skip
    assert set(zip(plan.pos_q.tolist(), plan.pos_d.tolist())) == {(0, 1), (2, 0), (2, 1)}
    # positions refer to the subset; reads go through the subset's rows
    assert torch.equal(plan.q_source, rows) and torch.equal(plan.d_order, rows)
    assert (plan.num_queries, plan.num_database) == (4, 4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"database_labels": None}, "give query_labels and database_labels"),
        ({"query_offsets": torch.zeros(3)}, "query_offsets must be"),
        ({"relevant_pairs": (torch.tensor([9]), torch.tensor([0]))}, "out of range"),
    ],
)
def test_bad_inputs_are_named(kwargs, message):
    x = torch.randn(6, 2)
    args = {"query_labels": torch.arange(6) % 2, "database_labels": torch.arange(6) % 2}
    with pytest.raises(ValueError, match=message):
        plan_problem(x, x.clone(), **{**args, **kwargs})
