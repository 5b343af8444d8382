"""Out-of-sample checks of the ``tail`` fit: a sub-sample against the rest.

The nested levels of a sample state are i.i.d. sub-samples, so the half S/2
and the rest of the sample are independent. Fit the ``tail`` posterior on the
half; for every positive that no score of the half reaches (a K0 positive of
the half: the ones whose hardness is pure extrapolation), it predicts how many
of the other half's S − S/2 scores lie above the positive,
``(S − S/2)·E[x]``; the sample says how many do. Summed over the positives of
a band of predicted relative depth ρ̄ = E[x]/ζ (ζ the exceedance rate of the
threshold; ρ̄ ≈ 0.01 is the fitted level's maximum), actual/predicted above 1
means the fitted tail is too light there, below 1 too heavy.

Given the population the sample was drawn from (in a validation, the pool's
state), the same check runs at the scale that matters: fit the whole sample,
count the rest of the population, N − S, above its K0 positives. Side by side
the two show how far what the sample can see (its half against its other
half) tells what it cannot (the population beyond its maximum):
``docs/tail_extrapolation.md`` ("When to trust a prediction").

Weighted by positives, as AP weights them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rl_gap.metrics.tail.hardness import sample_counts
from rl_gap.metrics.tail.posterior_predictive import tail_survival
from rl_gap.metrics.tail.sampling import NestedTopK

if TYPE_CHECKING:  # the predictor module does not import this one; typing only
    from rl_gap.metrics.tail.predictor import TailPredictor

#: Band edges of the predicted relative depth ρ̄: below 1e-3, 1e-3 to 1e-2, above.
DEPTH_EDGES = (1e-3, 1e-2)


@dataclass(frozen=True)
class TailCheck:
    """Predicted and actual other-part counts above the fitted level's K0 positives, per band.

    Attributes:
        edges: band edges of ρ̄ (B − 1 of them).
        positives: (B,) K0 positives of the fitted level in each band.
        predicted: (B,) their predicted counts in the other part, summed.
        actual: (B,) their actual counts in the other part, summed.
        other_size: scores in the other part (S, or the population's N, minus the
            fitted level's size).
    """

    edges: tuple[float, ...]
    positives: torch.Tensor
    predicted: torch.Tensor
    actual: torch.Tensor
    other_size: int

    @property
    def ratio(self) -> torch.Tensor:
        """(B,) actual / predicted (NaN where nothing was predicted)."""
        return torch.where(
            self.predicted > 0,
            self.actual / self.predicted.clamp_min(1e-300),
            torch.full_like(self.predicted, float("nan")),
        )

    def as_dict(self) -> dict:
        return {
            "edges": list(self.edges),
            "positives": self.positives.tolist(),
            "predicted": self.predicted.tolist(),
            "actual": self.actual.tolist(),
            "other_size": self.other_size,
        }


def out_of_sample_check(
    predictor: TailPredictor,
    level: int = -2,
    edges: tuple[float, ...] = DEPTH_EDGES,
    population: NestedTopK | None = None,
) -> TailCheck:
    """Check the ``tail`` fit of nested level ``level`` against the scores it did not see.

    Args:
        predictor: a :class:`~rl_gap.metrics.tail.predictor.TailPredictor`
            (its positives, nested state and ``tail`` settings are used).
        level: the level fitted (default the half, S/2).
        edges: increasing band edges of the predicted relative depth ρ̄.
        population: the state of the whole population the sample was drawn
            from (it must contain the sample: counts above a positive are
            taken from its full level). ``None``: the other part is the rest
            of the sample, so ``level`` must be a sub-sample; given, any level
            (``-1``: the whole sample against the rest of the population).

    Raises:
        ValueError: without ``population``, ``level`` is the full sample;
            ``edges`` do not increase; the population is smaller than the
            sample; or the state counted keeps too few scores to count the
            other part above a positive.
    """
    n_levels = len(predictor.state.fractions)
    if population is None and level % n_levels == n_levels - 1:
        raise ValueError(
            "the check fits a nested sub-sample level, not the full sample "
            "(pass the population to check the full sample against it)"
        )
    if any(b <= a for a, b in zip(edges[:-1], edges[1:])) or any(e <= 0 for e in edges):
        raise ValueError(f"edges must be positive and increasing, got {edges}")
    pos, valid = predictor.pos_sorted, predictor.valid
    counts_fit, post = predictor.tail_fit(level)
    _, n_fit = predictor.level(level)
    if population is None:
        top_all, n_all = predictor.level(-1)
    else:
        if population.n_queries != predictor.state.n_queries:
            raise ValueError(
                f"the population has {population.n_queries} queries, the sample "
                f"{predictor.state.n_queries}"
            )
        top_all, n_all = population.level(-1)
        if n_all < predictor.sample_size:
            raise ValueError(
                f"the population ({n_all} scores) is smaller than the sample "
                f"({predictor.sample_size}): it must contain it"
            )
    counts_all, saturated = sample_counts(pos, valid, top_all)
    checked = valid & (counts_fit == 0) & post.ok.unsqueeze(1)
    if bool((checked & saturated).any()):
        raise ValueError("the state keeps too few scores to count the other part above a positive")
    qi, mi = checked.nonzero(as_tuple=True)
    # E[x]/ζ: the posterior mean of the exceedance probability relative to the threshold.
    rho = (tail_survival(pos, valid, post, predictor.bayes)[qi, mi] * post.weight[qi]).sum(1)
    other = n_all - n_fit
    predicted = other * post.zeta[qi] * rho
    actual = counts_all[qi, mi]  # the fitted level holds none of them: all are the other part's
    band = torch.bucketize(rho, torch.tensor(edges, dtype=torch.float64), right=True)
    B = len(edges) + 1

    def per_band(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(B, dtype=torch.float64).index_add_(0, band, values.to(torch.float64))

    return TailCheck(
        edges=tuple(float(e) for e in edges),
        positives=per_band(torch.ones_like(rho)).long(),
        predicted=per_band(predicted),
        actual=per_band(actual),
        other_size=int(other),
    )
