"""Query-side score normalisation: offsets = beta x mean of a query's ``first..last`` best
background scores (a sorted Python list per query), the shifted scores, and the
augmented embeddings whose dot products are those scores."""

from __future__ import annotations

import pytest
import torch

from rl_gap.metrics.functional.score_norm import (
    ScoreNorm,
    background_offsets,
    normalize_scores,
    offset_embeddings,
)


def _reference_offsets(queries, background, beta, first, last) -> list[float]:
    out = []
    for q in queries.double():
        ranked = sorted((float(q @ b) for b in background.double()), reverse=True)
        out.append(beta * sum(ranked[first : last + 1]) / (last + 1 - first))
    return out


@pytest.mark.parametrize("norm", [ScoreNorm(), ScoreNorm(beta=0.5, first=1, last=3)])
@pytest.mark.parametrize("block_size", [3, 1000])
def test_offsets_are_beta_times_the_mean_of_the_chosen_neighbours(norm, block_size):
    g = torch.Generator().manual_seed(0)
    queries, background = torch.randn(6, 4, generator=g), torch.randn(11, 4, generator=g)
    offsets = background_offsets(queries.double(), background, norm, block_size=block_size)
    assert offsets.dtype == torch.float64
    expected = _reference_offsets(queries, background, norm.beta, norm.first, norm.last)
    assert offsets.tolist() == pytest.approx(expected, abs=1e-12)


def test_shifted_scores_and_augmented_embeddings_agree():
    g = torch.Generator().manual_seed(1)
    q, d, offsets = torch.randn(5, 3, generator=g), torch.randn(7, 3, generator=g), torch.rand(5)
    shifted = normalize_scores(q @ d.T, offsets)
    expected = torch.tensor(
        [[float(q[i] @ d[j]) - float(offsets[i]) for j in range(7)] for i in range(5)]
    )
    torch.testing.assert_close(shifted, expected, rtol=0, atol=1e-6)
    q_aug, d_aug = offset_embeddings(q, d, offsets)
    assert q_aug.shape == (5, 4) and d_aug.shape == (7, 4)
    torch.testing.assert_close(q_aug @ d_aug.T, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ScoreNorm(first=3, last=1), r"first \(3\) must be <= last \(1\)"),
        (lambda: ScoreNorm(last=-1), "last must be an integer >= 0"),
        (lambda: ScoreNorm(beta=float("nan")), "beta must be a finite number"),
        (
            lambda: background_offsets(torch.randn(2, 3), torch.randn(2, 3)),
            "needs at least 3 background items, got 2",
        ),
        (lambda: background_offsets(torch.randn(2, 3), torch.randn(5, 4)), "has dim 4"),
        (lambda: normalize_scores(torch.zeros(2, 3), torch.zeros(3)), r"offsets must be \(2,\)"),
    ],
)
def test_bad_settings_and_shapes_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
