"""The declared score range: affine invariance, rounding overshoot, refusal of scores outside it."""

from __future__ import annotations

import math

import pytest
import torch

from rl_gap.metrics.tail import predict_map
from rl_gap.metrics.tail.hardness import clip_to_range, resolve_score_range


def _cosine_world(Q=30, S=4000, d=12, seed=0):
    """Cosines of random unit vectors around a few centres; positives above most of the sample."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(5, d, generator=g, dtype=torch.float64)
    q = torch.nn.functional.normalize(centres[torch.arange(Q) % 5], dim=1)
    x = centres[torch.randint(0, 5, (S,), generator=g)]
    x = torch.nn.functional.normalize(
        x + 1.2 * torch.randn(S, d, generator=g, dtype=x.dtype), dim=1
    )
    sample = q @ x.T
    pos = torch.quantile(sample, 0.9995, dim=1, keepdim=True) + torch.rand(
        Q, 3, generator=g, dtype=torch.float64
    ) * (1 - torch.quantile(sample, 0.9995, dim=1, keepdim=True))
    return pos, sample


def _student_world(Q=30, S=4000, seed=1):
    g = torch.Generator().manual_seed(seed)
    sample = torch.distributions.StudentT(4.0).sample((Q, S)).double()
    pos = 6.0 + 4.0 * torch.rand(Q, 3, generator=g, dtype=torch.float64)
    return pos, sample


@pytest.mark.parametrize("a,b", [(2.0, 0.0), (0.37, 0.21), (5.0, -3.0)])
def test_default_prediction_is_invariant_to_affine_score_maps(a, b):
    pos, sample = _cosine_world()
    base = predict_map(pos, sample, 80_000, k=100, n_boot=50)
    mapped_range = (a * -1.0 + b, a * 1.0 + b)
    moved = predict_map(
        a * pos + b, a * sample + b, 80_000, k=100, n_boot=50, score_range=mapped_range
    )
    assert abs(moved.map - base.map) <= 1e-9
    assert torch.allclose(moved.hardness, base.hardness, rtol=1e-9, atol=1e-15)
    # Unbounded inner products (score_range None) keep the heavy-tailed shape bound, also invariant.
    pos, sample = _student_world()
    base = predict_map(pos, sample, 80_000, k=100, n_boot=50, score_range=None)
    moved = predict_map(a * pos + b, a * sample + b, 80_000, k=100, n_boot=50, score_range="dot")
    assert abs(moved.map - base.map) <= 1e-9
    # The bound is what was declared, not what the data look like: bounded and unbounded
    # declarations of the same (cosine) scores fit different shapes.
    assert float(base.fit.xi.max()) > 0.0


def test_rounding_overshoot_past_one_does_not_move_the_prediction():
    pos, sample = _cosine_world(seed=3)
    # A few near-copies at cosine 1 (exactly 1.0 in float64; float16 rounds them up to 1 + 2^-10).
    sample[:5, :3] = 1.0
    pos[5:8, 0] = 1.0
    exact = predict_map(pos, sample, 80_000, k=100, n_boot=50)
    over = sample.clone()
    over[:5, :3] = 1.0 + 2.0**-10
    pos_over = pos.clone()
    pos_over[5:8, 0] = 1.0 + 2.0**-8  # bfloat16's step above 1
    rounded = predict_map(pos_over, over, 80_000, k=100, n_boot=50)
    assert abs(rounded.map - exact.map) <= 1e-9
    # The cosine bound holds whatever the data: the default's posterior puts ξ ≤ 0 only,
    # and evt_support fits ξ ≤ 0 for every query.
    assert rounded.estimator == "tail_pooled" and float(rounded.fit.xi.max()) <= 0.0
    support = predict_map(pos_over, over, 80_000, k=100, n_boot=0, estimator="evt_support")
    assert float(support.fit.xi[support.fit.ok].max()) <= 0.0


def test_scores_outside_the_declared_range_are_refused():
    pos, sample = _cosine_world()
    with pytest.raises(ValueError, match=r"outside the declared score_range \[-1, 1\]"):
        predict_map(2.0 * pos, 2.0 * sample, 80_000, k=100, n_boot=10)
    with pytest.raises(ValueError, match="unknown similarity 'euclid'"):
        predict_map(pos, sample, 80_000, k=100, n_boot=10, score_range="euclid")
    with pytest.raises(ValueError, match="low < high"):
        resolve_score_range((1.0, -1.0))
    # Clipping: within the rounding margin to the bound; NaN padding and -inf untouched.
    t = torch.tensor([1.004, -1.002, 0.5, math.nan, -math.inf], dtype=torch.float64)
    out = clip_to_range(t, (-1.0, 1.0), "x")
    assert out[:3].tolist() == [1.0, -1.0, 0.5]
    assert math.isnan(out[3]) and out[4] == -math.inf
