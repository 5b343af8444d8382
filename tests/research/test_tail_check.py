"""The out-of-sample checks of the ``tail`` fit against brute force and a known law.

The sample's first half is standard exponential (its tail above any threshold
is exactly a GPD with ξ = 0) and its second half the same shifted by log 2, so
above every level the other half holds twice the first half's law: the check
must count the other half exactly, predict from the first half's law, and so
find the other half twice as heavy. The population adds 3·S more shifted
scores: against it the whole sample's law is 1.5·e^(−s), the rest's 2·e^(−s).
"""

from __future__ import annotations

import math

import pytest
import torch

from research.tail_check import out_of_sample_check
from rl_gap.metrics.tail import state_from_scores
from rl_gap.metrics.tail.predictor import TailPredictor

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
    # Unshuffled: the nested half is the first half of the columns, on purpose.
    predictor = TailPredictor(pos, state_from_scores(scores, 4000, shuffle=False), k=100)
    return predictor, pos, half, other


@pytest.fixture(scope="module")
def exponential_population():
    """A standard exponential sample and a population that adds 3·S scores shifted by log 2."""
    g = torch.Generator().manual_seed(1)
    sample = -torch.log(torch.rand(Q, S, generator=g, dtype=torch.float64))
    extra = -torch.log(torch.rand(Q, 3 * S, generator=g, dtype=torch.float64)) + SHIFT
    u = sample.sort(1, descending=True).values[:, 100]
    pos = torch.stack([u + 6.5, u + 8.0], 1)  # ρ = 1.5e-3 and 3.4e-4: beyond the sampled maximum
    predictor = TailPredictor(pos, state_from_scores(sample, 4000), k=100)
    population = state_from_scores(torch.cat([sample, extra], 1), 4000, shuffle=False)
    return predictor, population, pos, sample, extra


def _above(scores: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    return (scores.unsqueeze(1) >= pos.unsqueeze(2)).sum(-1).to(torch.float64)


def test_half_check_counts_the_other_half_and_predicts_the_half_law(shifted_halves):
    predictor, pos, half, other = shifted_halves
    check = out_of_sample_check(predictor)
    unreached = _above(half, pos) == 0  # K0 of the half, (Q, 2)
    above = _above(other, pos)
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
        out_of_sample_check(predictor, level=-1)
    with pytest.raises(ValueError, match="edges"):
        out_of_sample_check(predictor, edges=(1e-2, 1e-3))


def test_population_check_counts_the_rest_of_the_population(exponential_population):
    predictor, population, pos, sample, extra = exponential_population
    # The whole sample against the rest of the population (N − S = 3·S, all shifted).
    check = out_of_sample_check(predictor, level=-1, population=population)
    unreached = _above(sample, pos) == 0
    assert check.other_size == 3 * S
    assert int(check.positives.sum()) == int(unreached.sum())
    assert float(check.actual.sum()) == float(_above(extra, pos)[unreached].sum())
    # The sample's law, P(Exp(1) > s) = exp(−s), over 3·S draws. The posterior mean over an
    # uncertain shape lies above it this far out (30% here), never below.
    law = float((3 * S * torch.exp(-pos))[unreached].sum())
    assert law < float(check.predicted.sum()) < 1.6 * law
    ratio = float(check.actual.sum() / check.predicted.sum())
    assert 1.3 < ratio < 2.4, ratio  # the rest is log 2 further out: twice the law

    # The half against everything it did not see: the sample's other half and the extra scores.
    check = out_of_sample_check(predictor, population=population)
    # The nested half: the first half of the columns permuted with the seed (0).
    perm = torch.randperm(S, generator=torch.Generator().manual_seed(0))
    unreached = _above(sample[:, perm[: S // 2]], pos) == 0
    rest = torch.cat([sample[:, perm[S // 2 :]], extra], 1)
    assert check.other_size == 4 * S - S // 2
    assert int(check.positives.sum()) == int(unreached.sum())
    assert float(check.actual.sum()) == float(_above(rest, pos)[unreached].sum())


def test_population_check_rejects_a_population_that_cannot_hold_the_sample(exponential_population):
    predictor, _, _, sample, _ = exponential_population
    with pytest.raises(ValueError, match="smaller than the sample"):
        out_of_sample_check(
            predictor, level=-1, population=state_from_scores(sample[:, :100], 4000)
        )
    with pytest.raises(ValueError, match="queries"):
        out_of_sample_check(predictor, level=-1, population=state_from_scores(sample[:10], 4000))
