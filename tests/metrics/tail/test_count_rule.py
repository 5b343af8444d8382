"""The tail count rule: a positive reached by exactly ``min_count`` sampled distractors is
counted (x = K/S); only fewer fall back to the tail fit (evt and tail).
"""

import itertools

import pytest
import torch

from rl_gap.metrics.tail import predict_map

S, N, K_AT = 20_000, 1_000_000, 1000
MIN_COUNT = 5


def _world():
    """4 queries x 20,000 N(0,1) sample scores; positives at the 4th, 5th and 51st largest."""
    gen = torch.Generator().manual_seed(0)
    sample = torch.randn(4, S, generator=gen, dtype=torch.float64)
    top = sample.sort(dim=1, descending=True).values
    ranks = [MIN_COUNT - 1, MIN_COUNT, 51]  # sampled distractors >= the positive (ties count)
    pos = torch.stack([top[:, r - 1] for r in ranks], dim=1)
    return pos, sample, ranks


def _brute_counts(pos, sample):
    return torch.tensor(
        [[int((sample[q] >= s).sum()) for s in pos[q]] for q in range(pos.shape[0])]
    )


def _evt_survival(s, fit, q):
    """The paper's x = ζ (1 + ξ (s − u)/σ)^(−1/ξ), 0 beyond the endpoint (App. B)."""
    u, sigma, xi, zeta = (float(getattr(fit, a)[q]) for a in ("threshold", "sigma", "xi", "zeta"))
    base = 1.0 + xi * (s - u) / sigma
    return 0.0 if base <= 0 else zeta * base ** (-1.0 / xi)


@pytest.mark.parametrize("estimator", ["evt", "tail"])
def test_a_positive_reached_exactly_min_count_times_is_counted(estimator):
    pos, sample, ranks = _world()
    counts = _brute_counts(pos, sample)
    assert counts.tolist() == [ranks] * 4
    est = predict_map(pos, sample, gallery_size=N, k=K_AT, estimator=estimator, n_boot=10)
    assert est.hardness.shape == (4, 3)
    for q, (j, c) in itertools.product(range(4), enumerate(ranks)):
        x = float(est.hardness[q, j])
        if c >= MIN_COUNT:
            assert x == c / S, (q, c)  # counted: x = K/S exactly
        else:
            assert x != c / S  # fewer than min_count: taken from the tail
            if estimator == "evt":
                assert x == pytest.approx(_evt_survival(float(pos[q, j]), est.fit, q), rel=1e-9)
