"""The out-of-sample half check of the ``tail`` fit against brute force and a known law.

The sample's first half is standard exponential (its tail above any threshold
is exactly a GPD with ξ = 0) and its second half the same shifted by log 2, so
above every level the other half holds twice the first half's law: the check
must count the other half exactly, predict from the first half's law, and so
find the other half twice as heavy.
"""

from __future__ import annotations

import math

import pytest
import torch

from rl_gap.metrics.tail import state_from_scores
from rl_gap.metrics.tail_check import half_sample_check
from rl_gap.metrics.tail_predictor import TailPredictor

Q, S = 300, 20000
SHIFT = math.log(2.0)


@pytest.fixture(scope="module")
def shifted_halves():
    g = torch.Generator().manual_seed(0)
    scores = -torch.log(torch.rand(Q, S, generator=g, dtype=torch.float64))
    scores[:, S // 2 :] += SHIFT
    half, other = scores[:, : S // 2], scores[:, S // 2 :]
    u = half.sort(1, descending=True).values[:, 100]  # the half's threshold (100 exceedances)
    # ρ = P(Y > s − u) = 4e-3 (band 1e-3–1e-2) and 4.5e-5 (band < 1e-3).
    pos = torch.stack([u + 5.5, u + 10.0], 1)
    predictor = TailPredictor(pos, state_from_scores(scores, 4000), k=100)
    return predictor, pos, half, other


def test_half_check_counts_the_other_half_and_predicts_the_half_law(shifted_halves):
    predictor, pos, half, other = shifted_halves
    check = half_sample_check(predictor)
    unreached = (half.unsqueeze(1) >= pos.unsqueeze(2)).sum(-1) == 0  # K0 of the half, (Q, 2)
    above = (other.unsqueeze(1) >= pos.unsqueeze(2)).sum(-1).to(torch.float64)
    assert check.other_size == S - S // 2
    assert int(check.positives.sum()) == int(unreached.sum())
    assert float(check.actual.sum()) == float(above[unreached].sum())
    # The deep positives (ρ = 4.5e-5) are all in the deepest band.
    assert int(check.positives[0]) >= int(unreached[:, 1].sum())
    # The first half's law: P(Exp(1) > s) = exp(−s), over the other half's S/2 draws.
    law = (S - S // 2) * torch.exp(-pos)
    assert float(check.predicted.sum()) == pytest.approx(float(law[unreached].sum()), rel=0.2)
    # The other half is log 2 further out: twice the predicted count.
    ratio = float(check.actual.sum() / check.predicted.sum())
    assert 1.4 < ratio < 2.8, ratio


def test_half_check_rejects_the_full_level_and_bad_edges(shifted_halves):
    predictor = shifted_halves[0]
    with pytest.raises(ValueError, match="sub-sample level"):
        half_sample_check(predictor, level=-1)
    with pytest.raises(ValueError, match="edges"):
        half_sample_check(predictor, edges=(1e-2, 1e-3))
