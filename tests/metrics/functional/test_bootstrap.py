"""gAP/mAP bootstrap: weighted statistics equal the metrics of replicated queries (scikit-learn)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from rl_gap.metrics.functional import bootstrap_from_state, state_from_scores
from rl_gap.metrics.functional.bootstrap import bootstrap_statistics


def test_bootstrap_statistics_exact_against_replicated_rows():
    g = torch.Generator().manual_seed(11)
    scores = torch.round(torch.rand(12, 40, generator=g, dtype=torch.float64) * 30) / 30
    rel = torch.rand(12, 40, generator=g) < 0.2
    rel[3] = False
    state = state_from_scores(scores, rel, bootstrap_budget=1 << 20)
    weights = torch.randint(0, 3, (6, 12), generator=g).double()
    weights[:, 0] += 1  # a query with positives in every sample
    gaps, maps = bootstrap_statistics(state, weights)
    for b in range(6):
        rows = torch.repeat_interleave(torch.arange(12), weights[b].long())
        s, r = scores[rows].numpy(), rel[rows].numpy()
        assert float(gaps[b]) == pytest.approx(
            average_precision_score(r.ravel(), s.ravel()), abs=1e-12
        )
        aps = [average_precision_score(r[i], s[i]) for i in range(len(rows)) if r[i].any()]
        assert float(maps[b]) == pytest.approx(np.mean(aps), abs=1e-12)
    ci = bootstrap_from_state(state, 200)
    assert ci["gap_ci_exact"] == 1.0 and ci["gap_ci_low"] <= ci["gap_ci_high"]
    # A small budget keeps fewer knots: approximate but close.
    coarse = state_from_scores(scores, rel, bootstrap_budget=12 * 4)
    approx_gap, _ = bootstrap_statistics(coarse, weights)
    assert torch.allclose(approx_gap, gaps, atol=0.05)
