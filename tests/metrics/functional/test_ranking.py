"""Metrics read from a retrieval state (per-query AP@k, R@k with ties against the query,
gAP of query groups, the best shared-threshold F1) against brute force on the matrix."""

from __future__ import annotations

import math

import pytest
import torch

from rl_gap.metrics.functional import ranking, state_from_scores


def _problem(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 8, (7, 15), generator=g).double() / 8  # ties on purpose
    rel = torch.rand(7, 15, generator=g) < 0.3
    rel[2] = False  # no positive
    return scores, rel


def _ap_at(scores, rel, k):
    """AP@k: precision at each positive ranked <= k (rank = items scoring >= it)."""
    positives = [j for j in range(len(scores)) if rel[j]]
    total = 0.0
    for j in positives:
        rank = int((scores >= scores[j]).sum())
        if k is None or rank <= k:
            total += int((rel & (scores >= scores[j])).sum()) / rank
    return total / (len(positives) if k is None else min(k, len(positives)))


@pytest.mark.parametrize("k", [None, 1, 3, 20])
def test_per_query_ap_at_k(k):
    scores, rel = _problem()
    ap, has_pos = ranking.per_query_ap(state_from_scores(scores, rel), k)
    assert has_pos.tolist() == rel.any(1).tolist()
    for q in range(7):
        if rel[q].any():
            assert float(ap[q]) == pytest.approx(_ap_at(scores[q], rel[q], k), abs=1e-12)
        else:
            assert math.isnan(float(ap[q]))


@pytest.mark.parametrize("k", [1, 2, 5])
def test_recall_at_k_breaks_ties_against_the_query(k):
    scores, rel = _problem(1)
    hits = []
    for q in range(7):
        if rel[q].any():
            best = scores[q][rel[q]].max()
            hits.append(int(((scores[q] >= best) & ~rel[q]).sum()) < k)
    got = ranking.recall_at_k_from_state(state_from_scores(scores, rel), k)
    assert float(got) == pytest.approx(sum(hits) / len(hits), abs=1e-12)


def test_global_f1_is_the_best_shared_threshold():
    scores, rel = _problem(2)
    best = max(
        2 * int((rel & (scores >= t)).sum()) / (int((scores >= t).sum()) + int(rel.sum()))
        for t in scores[rel].unique().tolist()
    )
    f1, threshold = ranking.global_f1_from_state(state_from_scores(scores, rel))
    assert float(f1) == pytest.approx(best, abs=1e-12)
    retrieved = scores >= float(threshold)
    achieved = 2 * int((rel & retrieved).sum()) / (int(retrieved.sum()) + int(rel.sum()))
    assert achieved == pytest.approx(best, abs=1e-12)


def test_group_gap_ranks_only_that_groups_queries():
    from sklearn.metrics import average_precision_score

    scores, rel = _problem(3)
    group = torch.tensor([0, 1, 0, 1, 1, 0, 0])
    state = state_from_scores(scores, rel, None, group, 2)
    for g in (0, 1):
        rows = group == g
        expected = average_precision_score(rel[rows].flatten(), scores[rows].flatten())
        assert float(ranking.global_ap_from_state(state, [g])) == pytest.approx(expected, 1e-12)
