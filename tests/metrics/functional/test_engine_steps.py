"""The engine's steps (``engine.py``) against brute force on the materialised matrix.

Dyadic embeddings make every score exact in float32 whatever the block shape, so
counts are compared exactly, ties included."""

from __future__ import annotations

import pytest
import torch

from rl_gap.metrics.functional.engine import (
    count_negatives,
    score_positives,
    state_in_query_order,
)
from rl_gap.metrics.functional.engine_blocks import BlockScorer
from rl_gap.metrics.functional.engine_plan import plan_problem


def _problem(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    db = torch.randint(-3, 4, (29, 6), generator=g).float() / 4
    labels = torch.randint(0, 6, (29,), generator=g)
    index = torch.tensor([3, 17, 0, 25, 8, 11, 21])
    labels[25] = 99  # a distractor query: no other item of its class
    return db, labels, index


def _plan(db, labels, index, **kwargs):
    return plan_problem(
        db[index], db, labels[index], labels, query_index=index, block_size=(3, 4), **kwargs
    )


def _brute(db, labels, index):
    """float64 scores, positives and negatives of each query (self pair dropped)."""
    scores = db[index].double() @ db.double().T
    valid = torch.ones_like(scores, dtype=torch.bool)
    valid[torch.arange(len(index)), index] = False
    rel = (labels[index][:, None] == labels[None]) & valid
    return scores, rel, valid & ~rel


@pytest.mark.parametrize("cache_bytes", [0, 1 << 20])
def test_score_positives_reads_every_positive_once(cache_bytes):
    db, labels, index = _problem()
    plan = _plan(db, labels, index)
    positives = score_positives(plan, BlockScorer(plan), cache_bytes)
    scores, rel, _ = _brute(db, labels, index)
    q = plan.perm_q[positives.query]
    d = plan.d_order[positives.item]
    assert sorted(zip(q.tolist(), d.tolist())) == sorted(map(tuple, rel.nonzero().tolist()))
    assert torch.equal(positives.scores.double(), scores[q, d])
    for block in positives.cache.values():  # kept blocks: positives masked for step 2
        assert torch.isinf(block).any()
    assert (len(positives.cache) > 0) == (cache_bytes > 0)


def test_count_negatives_equals_brute_force_counts_with_ties():
    db, labels, index = _problem(1)
    plan = _plan(db, labels, index)
    scorer = BlockScorer(plan)
    counts = count_negatives(plan, scorer, score_positives(plan, scorer, 0))
    scores, rel, negative = _brute(db, labels, index)
    q = plan.perm_q[counts.pos_query]
    for query, score, got in zip(q.tolist(), counts.pos_scores.double(), counts.pos_neg_ge):
        assert int(got) == int(((scores[query] >= score) & negative[query]).sum())
    grid = sorted(set(scores[rel].tolist()))
    assert counts.grid.double().tolist() == grid
    expected = [int(((scores >= v) & negative).sum()) for v in grid]
    assert counts.grid_neg_ge[0].tolist() == expected


def test_state_in_query_order_equals_the_dense_state():
    from rl_gap.metrics.functional.dense import state_from_scores

    db, labels, index = _problem(2)
    group = (torch.arange(len(index)) % 2).long()
    plan = _plan(db, labels, index, query_group=group, num_groups=2)
    scorer = BlockScorer(plan)
    state = state_in_query_order(
        plan, count_negatives(plan, scorer, score_positives(plan, scorer, 1 << 20))
    )
    scores, rel, negative = _brute(db, labels, index)
    dense = state_from_scores(scores.float(), rel, rel | negative, group, 2)
    for name in ("pos_scores", "pos_query", "pos_neg_ge", "grid", "pos_grid_index",
                 "grid_neg_ge", "query_group", "num_negatives"):  # fmt: skip
        assert torch.equal(getattr(state, name), getattr(dense, name)), name
