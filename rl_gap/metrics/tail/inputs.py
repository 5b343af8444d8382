"""Input checks of a tail prediction, each made once: the scores, and what is asked for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rl_gap.metrics.tail.intervals import check_n_boot
from rl_gap.metrics.tail.registry import Estimator, get_estimator, resolve_rank_law

if TYPE_CHECKING:
    from rl_gap.metrics.tail.sampling import NestedTopK


def check_positive_scores(pos_scores: torch.Tensor, n_queries: int | None = None) -> None:
    """Raise ValueError unless ``pos_scores`` is a (Q, m) float tensor with finite or NaN entries."""
    if not isinstance(pos_scores, torch.Tensor) or pos_scores.dim() != 2:
        raise ValueError(
            f"pos_scores must be a (Q, m) tensor, got {getattr(pos_scores, 'shape', type(pos_scores))}"
        )
    if not pos_scores.is_floating_point():
        raise ValueError(f"pos_scores must be floating point (NaN-padded), got {pos_scores.dtype}")
    if bool(torch.isinf(pos_scores).any()):
        raise ValueError("pos_scores contains ±inf; use NaN only to pad missing positives")
    if n_queries is not None and pos_scores.shape[0] != n_queries:
        raise ValueError(
            f"pos_scores has {pos_scores.shape[0]} queries, the sample scores {n_queries}"
        )


def check_sample_matrix(sample_scores: torch.Tensor) -> None:
    """Raise ValueError unless ``sample_scores`` is a non-empty (Q, S) floating-point tensor."""
    if not isinstance(sample_scores, torch.Tensor) or sample_scores.dim() != 2:
        raise ValueError(
            f"sample_scores must be a (Q, S) tensor, got {getattr(sample_scores, 'shape', type(sample_scores))}"
        )
    if not sample_scores.is_floating_point():
        raise ValueError(f"sample_scores must be floating point, got {sample_scores.dtype}")
    if sample_scores.shape[1] == 0:
        raise ValueError("the distractor sample is empty (sample_scores has 0 columns)")


def check_k(k: int) -> None:
    if int(k) < 1:
        raise ValueError(f"k must be >= 1, got {k}")


def check_predictor_inputs(pos_scores: torch.Tensor, state: NestedTopK, k: int) -> None:
    """The positives, the sample state and k of a :class:`TailPredictor` agree."""
    check_positive_scores(pos_scores, state.n_queries)
    check_k(k)
    if state.capacity < min(int(k), int(state.seen.sum())):
        # Counts are exact below the kept depth; with every sampled score kept, always.
        raise ValueError(
            f"the state keeps {state.capacity} scores per query; need >= min(k = {k}, sample size)"
        )


@dataclass(frozen=True)
class EstimateRequest:
    """One checked prediction request (:func:`resolve_request`): the home of the options of
    :func:`~rl_gap.metrics.tail.pipeline.estimate` (``TailPredictor.estimate``) and of their
    defaults.

    Attributes:
        estimator: the estimator asked for.
        gallery_size: N to predict for (≥ S).
        rank_law: the resolved rank law ("predictive", "plugin", "binomial" or "poisson").
        n_boot: query-bootstrap replicates; 0 = no interval (``ci`` and ``ci_total`` None;
            the budget check then takes its query noise from 200 replicates of its own).
        confidence: interval mass.
        nested_boot: if > 0, also resample the distractor sample this many times
            (Poisson(1) multiplicities) jointly with the queries, for ``nested_ci`` and
            ``sample_noise_sd`` (``uncertainty.joint_bootstrap``).
        budget: add the sufficient-budget diagnostic (S/4, S/2, S).
        diagnose: for the per-positive estimators, run the checks of ``diagnostics`` and
            fill ``flags``, ``ci_total`` and ``diagnostics``.
    """

    estimator: Estimator
    gallery_size: int
    rank_law: str
    n_boot: int = 1000
    confidence: float = 0.95
    nested_boot: int = 0
    budget: bool = False
    diagnose: bool = True

    @property
    def name(self) -> str:
        return self.estimator.name


def resolve_request(
    estimator: str | Estimator,
    gallery_size: int,
    sample_size: int,
    k: int | None = None,
    rank_law: str | None = None,
    **options,
) -> EstimateRequest:
    """Check what is asked for against the sample (one ValueError naming the problem).

    ``k`` is checked when given; None where a predictor, built from it, checked it.
    ``options``: the request's other fields (``n_boot``, ``confidence``, ``nested_boot``,
    ``budget``, ``diagnose``; an unknown one is a TypeError).
    """
    check_n_boot(options.get("n_boot", EstimateRequest.n_boot))
    est = get_estimator(estimator)
    law = resolve_rank_law(est, rank_law)
    if k is not None:
        check_k(k)
    if sample_size < 1:
        raise ValueError("the distractor sample is empty")
    if gallery_size < sample_size:
        raise ValueError(
            f"gallery_size ({gallery_size}) must be >= the distractor sample size ({sample_size}): "
            "the estimators extrapolate to larger galleries"
        )
    return EstimateRequest(est, gallery_size, law, **options)
