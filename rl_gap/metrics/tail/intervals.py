"""Intervals of a tail prediction: the query bootstrap and the joint (queries × sample) bootstrap."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TYPE_CHECKING

import torch

from rl_gap.metrics.tail import rows as row_blocks
from rl_gap.metrics.tail.sampling import poisson_multiplicities

if TYPE_CHECKING:
    from rl_gap.metrics.tail.predictor import TailPredictor
    from rl_gap.metrics.tail.registry import Estimator


def check_n_boot(n_boot: int) -> None:
    """Raise ValueError unless ``n_boot`` is a count ≥ 0 (0 = no interval)."""
    if isinstance(n_boot, bool) or int(n_boot) != n_boot or n_boot < 0:
        raise ValueError(f"n_boot must be an integer >= 0 (0 = no interval), got {n_boot!r}")


def percentile_interval(replicates: torch.Tensor, confidence: float = 0.95) -> tuple[float, float]:
    """Central ``confidence`` percentile interval of bootstrap replicates (1-D, non-empty)."""
    if replicates.numel() == 0:
        raise ValueError("no bootstrap replicate to take an interval from (n_boot = 0)")
    alpha = (1.0 - confidence) / 2.0
    q = torch.tensor([alpha, 1.0 - alpha], dtype=torch.float64, device=replicates.device)
    lo, hi = torch.quantile(replicates.to(torch.float64), q)
    return float(lo), float(hi)


def bootstrap_ci(
    per_query: torch.Tensor,
    n_boot: int = 1000,
    confidence: float = 0.95,
    generator: torch.Generator | None = None,
) -> tuple[float, float] | None:
    """Percentile interval of the mean over queries, resampling queries (per-query values fixed).

    Args:
        per_query: (Q,) values; NaN entries (excluded queries) are ignored.
        n_boot: bootstrap replicates; 0 = no interval (returns None).
        confidence: interval mass.
    """
    check_n_boot(n_boot)
    if n_boot == 0:
        return None
    values = per_query[~torch.isnan(per_query)].to(torch.float64)
    if values.numel() == 0:
        return (math.nan, math.nan)
    # Replicates drawn in chunks (the same draws as one (n_boot, Q) matrix): memory is a
    # block, not n_boot × Q.
    chunk = max(1, row_blocks.ROW_BLOCK_VALUES // values.numel())
    means = []
    for start in range(0, n_boot, chunk):
        rows = min(chunk, n_boot - start)
        idx = torch.randint(0, values.numel(), (rows, values.numel()), generator=generator)
        means.append(values[idx].mean(1))
    return percentile_interval(torch.cat(means), confidence)


def joint_bootstrap(
    predictor: TailPredictor,
    estimator: Estimator,
    gallery_size: int,
    rank_law: str,
    n_rep: int,
    confidence: float,
    per_query: torch.Tensor,
) -> tuple[tuple[float, float], float]:
    """(interval, distractor-sample sd) resampling queries and the distractor sample together.

    With a keyed state a distractor gets one Poisson(1) multiplicity for every
    query (one distractor that ranks high for many queries moves them all);
    otherwise each query's kept scores are resampled on their own. ``rank_law`` is the
    estimator's resolved law (``inputs.resolve_request``).
    """

    gen = predictor.generator(1)
    top, _ = predictor.level(-1)
    keys = predictor.level_keys(-1)
    finite = torch.isfinite(top).to(torch.float64)
    rows = predictor.query_ok.nonzero().squeeze(1)
    # An expensive estimator's replicates may run cheaper settings and carry each
    # query's difference to the full prediction.
    fast = estimator.replicate_settings(predictor, rank_law)
    shift = 0.0
    if fast is not None:
        plain = predictor.per_query(estimator.name, gallery_size, rank_law, bayes=fast)
        shift = (per_query - plain)[rows]
    estimate = float(per_query[rows].mean())
    joint, sample_only = [], []
    for b in range(n_rep):
        if keys is None:  # each query's kept scores resampled on their own
            weight = torch.poisson(finite, generator=gen)
        else:  # one multiplicity per distractor, shared by every query
            weight = poisson_multiplicities(keys, b, predictor.seed) * finite
        pq = predictor.per_query(estimator, gallery_size, rank_law, weight=weight, bayes=fast)
        pq = pq[rows] + shift
        sample_only.append(pq.mean())
        pick = torch.randint(0, rows.numel(), (rows.numel(),), generator=gen)
        joint.append(pq[pick].mean())
    # Centred on the prediction: reweighting the few sampled distractors above a
    # positive shifts the replicates' mean (a count of 1 becomes 0 in 37% of
    # them), which is the resampling's artefact, not the estimator's bias.
    # Normal width from the replicates' sd: stable with the few replicates
    # that an expensive estimator affords (percentiles of 25 are extremes).
    half = NormalDist().inv_cdf(0.5 + confidence / 2) * float(torch.stack(joint).std())
    return (estimate - half, estimate + half), float(torch.stack(sample_only).std())
