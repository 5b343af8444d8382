"""The ceiling's upper bound: C <= the best interleaving's gAP <= U, and the suite reports both.

References: ``tests/ceiling_brute.py`` (exhaustive search, float64) and, for
the relaxation itself, the integer minimum m_i = min_{Σ t_q = i} Σ_q A_q(t_q)
found by a knapsack-style dynamic programme, each rank credited the best
precision at or after it (a tie group is credited at its end): U uses a relaxed
m̃_i <= m_i, so the brute-force optimum <= (1/P) Σ_i max_{i'>=i} i'/(i' + m_i') <= U.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ceiling_brute import best_interleaving_ap, random_instance

from rl_gap.metrics.functional import consistency_ceiling, evaluate_embeddings, state_from_scores
from rl_gap.metrics.functional.ceiling import ceiling_from_state, upper_bound_ap


def _forced_negatives(scores, rel, valid) -> list[list[int]]:
    """Per query with positives: A_q(t) for t = 0 … |P_q| (negatives >= its t-th positive)."""
    out = []
    for q in range(scores.shape[0]):
        s, r = scores[q][valid[q]], rel[q][valid[q]]
        pos = sorted(s[r].tolist(), reverse=True)
        if pos:
            out.append([0] + [int((s[~r] >= p).sum()) for p in pos])
    return out


def _integer_bound(scores, rel, valid) -> float:
    curves = _forced_negatives(scores, rel, valid)
    inf = float("inf")
    best = [0.0]  # best[i]: fewest forced negatives over the queries seen, i positives taken
    for curve in curves:
        nxt = [inf] * (len(best) + len(curve) - 1)
        for i, base in enumerate(best):
            for t, a in enumerate(curve):
                nxt[i + t] = min(nxt[i + t], base + a)
        best = nxt
    total = len(best) - 1
    # A positive of a tie group ending at positive i' >= i is credited i'/(i' + n_i'):
    # bound each rank by the best precision at or after it.
    precision = [i / (i + best[i]) for i in range(1, total + 1)]
    credit = [max(precision[i:]) for i in range(total)]
    return sum(credit) / total


def test_lower_optimum_upper_on_brute_forceable_instances():
    rng = np.random.default_rng(99)
    strict = 0
    for _ in range(250):
        scores, rel, valid = random_instance(rng)
        state = state_from_scores(torch.tensor(scores), torch.tensor(rel), torch.tensor(valid))
        out = ceiling_from_state(state)
        best = best_interleaving_ap(scores, rel, valid)
        integer = _integer_bound(scores, rel, valid)
        assert out["ceiling"] <= best + 1e-12
        assert best <= integer + 1e-12
        assert integer <= out["ceiling_upper"] + 1e-12
        assert out["ceiling_gap"] == pytest.approx(out["ceiling_upper"] - out["ceiling"])
        assert out["ceiling_gap"] >= 0
        strict += best < out["ceiling_upper"] - 1e-9
    assert strict > 0  # the bound is not the optimum itself


def test_upper_bound_of_hand_made_chains():
    # Chain 0: 2 negatives then 1 positive, then 0 negatives then 1 positive: one hull
    # segment of slope 1 (2 negatives / 2 positives). Chain 1: a positive first (slope 0).
    # m̃ = 0, 1, 2 for i = 1, 2, 3: U = (1/1 + 2/3 + 3/5) / 3.
    chains = [np.array([2, 0]), np.array([0])]
    assert upper_bound_ap(chains) == pytest.approx((1 + 2 / 3 + 3 / 5) / 3, abs=1e-15)
    # Tied block of 2 positives after 3 negatives: slope 3/2, m̃ = 1.5, 3.
    assert upper_bound_ap([np.array([3])], [np.array([2])]) == pytest.approx(
        (1 / 2.5 + 2 / 5) / 2, abs=1e-15
    )
    # No block (no chain, or chains without positives): no AP to bound.
    assert np.isnan(upper_bound_ap([])) and np.isnan(upper_bound_ap([np.zeros(0, np.int64)]))


def test_suite_and_functional_report_upper_and_gap():
    g = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(40, 8, generator=g, dtype=torch.float64), dim=1)
    labels = torch.arange(40) % 5
    out = evaluate_embeddings(emb, emb, labels, labels, exclude_self=True, ceiling=True)
    assert out["ceiling"] <= out["ceiling_upper"]
    assert out["ceiling_gap"] == pytest.approx(out["ceiling_upper"] - out["ceiling"])
    assert out["gap"] <= out["ceiling"] + 1e-12
    scores = emb @ emb.T
    rel = labels[:, None] == labels[None]
    valid = ~torch.eye(40, dtype=torch.bool)
    functional = consistency_ceiling(scores, rel & valid, valid)
    assert float(functional["ceiling_upper"]) == pytest.approx(out["ceiling_upper"], abs=1e-12)
    assert float(functional["ceiling_gap"]) == pytest.approx(out["ceiling_gap"], abs=1e-12)
