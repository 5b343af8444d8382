"""The query bootstrap of a tail prediction: percentile intervals of the mean over queries.

The joint (queries × sample) bootstrap and the fixed-query interval are in ``uncertainty``.
"""

from __future__ import annotations

import math

import torch

from rl_gap.metrics.tail import rows as row_blocks


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
    return query_bootstrap(per_query, n_boot, confidence, generator)


def query_bootstrap(
    per_query: torch.Tensor,
    n_boot: int,
    confidence: float = 0.95,
    generator: torch.Generator | None = None,
) -> tuple[float, float] | None:
    """:func:`bootstrap_ci` of an ``n_boot`` already checked (a prediction checks it once, on
    its request)."""
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
