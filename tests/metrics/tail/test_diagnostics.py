"""Diagnostics of tail predictions: threshold stability, the budget check, the widened interval."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from rl_gap.metrics.tail import TailPredictor, predict_map, state_from_scores
from rl_gap.metrics.tail.diagnostics import Diagnostics, diagnose, threshold_predictions
from rl_gap.metrics.tail.hardness import TailConfig, fit_tail


def _gpd_world(Q=150, S=20_000, m=3, seed=0):
    """Scores with an exact GPD tail everywhere: P(score ≥ s) = (1 − s)^4 on [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    sample = 1.0 - torch.rand(Q, S, generator=g, dtype=torch.float64).pow(0.25)
    # Positives at hardness 1e-6 … 1e-4 (N·x = 0.4 … 40 at N = 400k).
    x = torch.exp(
        torch.empty(Q, m, dtype=torch.float64).uniform_(math.log(1e-6), math.log(1e-4), generator=g)
    )
    return 1.0 - x.pow(0.25), sample


def _bump_world(Q=150, S=20_000, m=3, seed=0):
    """A normal bulk plus a rare tight bump of near-copies above it (rate 2e-4): the
    sub-samples see it 1, 2 and 4 times per query, so their predictions disagree."""
    g = torch.Generator().manual_seed(seed)
    sample = torch.randn(Q, S, generator=g, dtype=torch.float64)
    bump = torch.rand(Q, S, generator=g) < 2e-4
    sample[bump] = 4.6 + 0.15 * torch.randn(int(bump.sum()), generator=g, dtype=torch.float64)
    pos = 4.5 + 0.3 * torch.randn(Q, m, generator=g, dtype=torch.float64)
    return pos, sample


def test_n_excess_sets_the_threshold_to_the_n_plus_first_score():
    _, sample = _gpd_world(Q=5, S=3000)
    top = torch.sort(sample, 1, descending=True).values[:, :1000]
    for n in (25, 400):
        fit = fit_tail(top, 3000, config=TailConfig(n_excess=n))
        assert torch.equal(fit.threshold, top[:, n])
        assert torch.allclose(fit.zeta, torch.full((5,), n / 3000, dtype=torch.float64))


def test_counted_prediction_is_supported_and_a_bump_is_flagged():
    N = 400_000
    # Positives the sample reaches ~100 times: counted, whatever the threshold.
    g = torch.Generator().manual_seed(3)
    sample = torch.randn(100, 20_000, generator=g, dtype=torch.float64)
    pos = 2.4 + 0.1 * torch.randn(100, 3, generator=g, dtype=torch.float64)
    est = predict_map(pos, sample, 40_000, k=1000, estimator="evt", n_boot=100)
    assert est.flags == [] and est.supported
    assert est.diagnostics.threshold_spread == pytest.approx(0.0, abs=1e-12)
    # Thresholds agree: the widened interval is the bootstrap one re-centred on them.
    assert est.ci_total[0] <= est.ci[0] and est.ci_total[1] >= est.ci[1]
    assert est.ci_total == pytest.approx(est.ci, abs=2e-3)
    pos, sample = _bump_world()
    est = predict_map(pos, sample, N, k=1000, estimator="evt", n_boot=100)
    assert not est.supported
    # S/4 sees one copy per query, S four: the nested predictions disagree (App. D).
    assert any(f.startswith("budget not converged") for f in est.flags)
    assert est.diagnostics.budget_spread > 0.1
    assert est.to_dict()["flags"] == est.flags and est.to_dict()["supported"] is False


def test_threshold_spread_and_widened_interval_match_their_definitions():
    pos, sample = _bump_world(Q=60)
    pred = TailPredictor(pos, state_from_scores(sample, 4000), 1000)
    per = threshold_predictions(pred, 400_000)
    maps = {n: float(v.mean()) for n, v in per.items()}  # every query has positives
    diag = diagnose(pred, 400_000)
    assert diag.threshold_maps == pytest.approx(maps, abs=1e-12)
    assert diag.threshold_spread == pytest.approx(max(maps.values()) - min(maps.values()))
    # The widened interval: every threshold's prediction ± the interval's own half-widths.
    d = Diagnostics(threshold_maps={25: 0.40, 200: 0.50, 400: 0.55})
    assert d.widen((0.48, 0.52)) == pytest.approx((0.38, 0.57))
    assert d.widen((0.30, 0.70)) == pytest.approx((0.20, 0.75))
    assert Diagnostics().widen((0.1, 0.2)) == (0.1, 0.2)


def test_metric_logs_supported_and_warns_with_the_reason():
    from rl_gap.metrics import TailExtrapolatedMAP

    pos, sample = _bump_world(Q=40, S=8000)
    metric = TailExtrapolatedMAP(gallery_size=160_000, k=100, estimator="evt", n_boot=50)
    metric.update(positive_scores=pos)
    metric.update(distractor_scores=sample.float())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = metric.compute()
    assert float(out["supported"]) == 0.0
    assert any("cannot support" in str(w.message) for w in caught)
