"""Curves drawn by the plots callback: global precision/recall at each positive score and
each query's F1-best threshold, against a brute-force sweep of a small matrix (float64)."""

from __future__ import annotations

import torch

from rl_gap.callbacks.curves import global_pr_curve, per_query_best_thresholds
from rl_gap.metrics.functional import state_from_scores


def _problem():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 6, (5, 9), generator=g).double() / 5  # ties on purpose
    rel = torch.rand(5, 9, generator=g) < 0.3
    rel[4] = False  # a query without positives
    return scores, rel


def test_global_curve_at_each_distinct_positive_score():
    scores, rel = _problem()
    precision, recall, thresholds = global_pr_curve(state_from_scores(scores, rel))
    expected_t = sorted(set(scores[rel].tolist()), reverse=True)
    assert thresholds.tolist() == expected_t
    for p, r, t in zip(precision.tolist(), recall.tolist(), expected_t):
        retrieved = scores >= t  # every pair scoring >= t, ties included
        hits = int((retrieved & rel).sum())
        assert abs(p - hits / int(retrieved.sum())) < 1e-12
        assert abs(r - hits / int(rel.sum())) < 1e-12


def test_each_query_best_f1_threshold_is_the_highest_of_its_best():
    scores, rel = _problem()
    thresholds, best = per_query_best_thresholds(state_from_scores(scores, rel))
    expected_t, expected_f1 = [], []
    for q in range(5):
        if not rel[q].any():
            continue
        candidates = []
        for t in sorted(set(scores[q][rel[q]].tolist()), reverse=True):
            retrieved = scores[q] >= t
            hits = int((retrieved & rel[q]).sum())
            candidates.append((2 * hits / (int(retrieved.sum()) + int(rel[q].sum())), t))
        f1, t = max(candidates)  # ties in F1: the higher threshold wins
        expected_t.append(t)
        expected_f1.append(f1)
    assert thresholds.tolist() == expected_t
    assert torch.allclose(best, torch.tensor(expected_f1, dtype=torch.float64), atol=1e-12)
