"""Per-query hardness estimators from a distractor sample's top scores.

*Web Scale on a Budget* §4 and App. B. For positive j (score s_j) of a query,
the hardness x_j is the fraction of the distractor population scoring ≥ s_j.
From an i.i.d. sample of S distractors, of which each query keeps its top T
scores (sorted descending, ``-inf`` padded when S < T):

- ``count``: x_j = K_j / S with K_j the sampled distractors scoring ≥ s_j
  (exact whenever K_j < T; K_j ≥ T only happens for positives that rank
  beyond k at every N ≥ S when T ≥ k).
- ``evt``: threshold u = the (n+1)-th largest score with n = round((1−q)·n_top)
  (the q-quantile of the top n_top = 4000), GPD fitted to the n excesses,
  ζ = n / S; where K_j < min_count and s_j ≥ u,
  x_j = ζ·(1 + ξ(s_j − u)/σ)^(−1/ξ), else the count.
- ``evt_support``: ``evt`` with a sample-size-aware threshold
  (:func:`sample_n_top`: the paper's constants from S = 10^6 on, fewer
  exceedances below) and the shape bound following the declared score
  range (``TailConfig.score_range``, never guessed from the data): ξ ≤ 0 for
  scores bounded above (cosine: [−1, 1], the default), else ξ ≤ 0.5 (unbounded
  inner products can have power-law tails, which ξ ≤ 0 cuts off). Scores past
  a finite bound by a rounding margin (float16/bfloat16 cosines overshoot 1)
  are clipped to it; further out they are refused. The prediction is invariant
  to an affine map of the scores (a·s + b, a > 0) applied with its range.

All functions accept optional per-score weights (Q, T) (Poisson-bootstrap
multiplicities of the sampled distractors) so that a resampled distractor
sample needs no re-materialisation.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from rl_gap.metrics.tail.gpd import (
    capped_excesses,
    fit_gpd,
    gpd_survival,
    largest_excess,
    profile_on_xi_grid,
    with_stand_in,
)


@dataclass(frozen=True)
class TailConfig:
    """EVT estimator settings (paper defaults, App. B).

    Attributes:
        n_top: scores per query the threshold is taken from (4000).
        threshold_quantile: threshold u at this quantile of the top n_top (0.95).
        min_count: use the fitted tail where fewer sampled distractors reach s_j (5).
        min_excesses: fewer (weighted) excesses → degenerate fit, fall back to counting.
        xi_min: lower bound on the GPD shape (−1; the upper bound is 0).
        n_excess: if set, fit the top ``n_excess`` exceedances instead of the
            quantile rule (threshold = the (n_excess + 1)-th largest score).
        xi_max: upper bound on ξ (0: the paper's bounded-score tail; > 0 allows
            heavy, power-law tails, fitted by profile likelihood on a ξ grid).
        score_range: (low, high) the similarity's declared range, or None for
            unbounded scores (inner products); used by ``evt_support``.
            :func:`resolve_score_range` turns a similarity name into it.
    """

    n_top: int = 4000
    threshold_quantile: float = 0.95
    min_count: int = 5
    min_excesses: float = 10.0
    xi_min: float = -1.0
    n_excess: int | None = None
    xi_max: float = 0.0
    score_range: tuple[float, float] | None = (-1.0, 1.0)


#: Declared similarities and their score ranges (None: unbounded).
SIMILARITY_RANGES: dict[str, tuple[float, float] | None] = {
    "cosine": (-1.0, 1.0),
    "dot": None,
}
#: Scores past a finite bound by up to this share of the range's half-width are
#: rounding (bfloat16 rounds cosines near 1 by up to 2^-8) and clipped; further out, refused.
RANGE_TOLERANCE = 0.01


def resolve_score_range(score_range) -> tuple[float, float] | None:
    """(low, high) or None from a similarity name ("cosine", "dot"), a pair, or None."""
    if score_range is None:
        return None
    if isinstance(score_range, str):
        if score_range not in SIMILARITY_RANGES:
            raise ValueError(
                f"unknown similarity {score_range!r} for score_range; known: "
                f"{', '.join(SIMILARITY_RANGES)} (or a (low, high) pair, or None = unbounded)"
            )
        return SIMILARITY_RANGES[score_range]
    try:
        low, high = (float(v) for v in score_range)
    except (TypeError, ValueError):
        raise ValueError(
            f"score_range must be a similarity name, a (low, high) pair or None, got {score_range!r}"
        ) from None
    if not low < high:
        raise ValueError(f"score_range must have low < high, got ({low}, {high})")
    return (low, high)


def clip_to_range(
    scores: torch.Tensor, score_range: tuple[float, float] | None, name: str
) -> torch.Tensor:
    """``scores`` with rounding overshoot past the declared range clipped; a clear error past it.

    Non-finite entries (NaN padding, -inf) pass unchanged.
    """
    if score_range is None:
        return scores
    low, high = score_range
    finite = torch.isfinite(scores)
    if not bool(finite.any()):
        return scores
    margin = RANGE_TOLERANCE * (high - low) / 2.0 if math.isfinite(high - low) else 0.0
    values = scores[finite]
    lo_seen, hi_seen = float(values.min()), float(values.max())
    if lo_seen < low - margin or hi_seen > high + margin:
        raise ValueError(
            f"{name} reach [{lo_seen:.6g}, {hi_seen:.6g}], outside the declared score_range "
            f"[{low:g}, {high:g}]; pass score_range=None (similarity 'dot') for unbounded "
            "inner products, or the similarity's own range"
        )
    clipped = scores.clamp(low, high)
    return torch.where(finite, clipped, scores)


#: ``evt_support``'s shape bound for scores outside [−1, 1] (unbounded inner products).
UNBOUNDED_XI_MAX = 0.5


DEFAULT_CONFIG = TailConfig()

#: Sample size from which ``evt_support`` keeps the paper's constants (top 4,000, 200 exceedances).
PAPER_SAMPLE = 1_000_000


def sample_n_top(n_sample: int, n_top: int = DEFAULT_CONFIG.n_top) -> int:
    """Top scores per query ``evt_support`` thresholds in, for a sample of ``n_sample``.

    ``n_top · sqrt(S / 10^6)``, capped at ``n_top``: the paper's 4,000 (200
    exceedances at the 95th percentile) from S = 10^6 on, 400 (20) at S = 10^4,
    1,265 (63) at 10^5. A fixed 4,000 would reach 40% deep into a 10^4 sample,
    into the bulk of each query's own cluster; a fixed share of S would leave
    too few exceedances to fit. The √S rate is the usual compromise between the
    bias of a deep threshold and the variance of a shallow one, and it was
    chosen on the design worlds (docs/tail_validation.md).
    """
    return max(1, min(int(n_top), int(round(n_top * math.sqrt(n_sample / PAPER_SAMPLE)))))


def sample_excesses(n_sample: int, config: TailConfig = DEFAULT_CONFIG) -> int:
    """Exceedances ``evt_support`` fits for a sample of ``n_sample`` (200 from 10^6 on, at
    least ``min_excesses``)."""
    if config.n_excess is not None:
        return int(config.n_excess)
    n_top = min(sample_n_top(n_sample, config.n_top), n_sample)
    # Never fewer than a fit needs (10 below S ≈ 2,500), nor more than the sample holds.
    n = max(int(config.min_excesses), int(round((1.0 - config.threshold_quantile) * n_top)))
    return max(1, min(n, n_sample - 1))


@dataclass
class TailFit:
    """Per-query EVT tail (all (Q,) tensors).

    Attributes:
        threshold: u.
        sigma, xi: GPD parameters (NaN where not ok).
        zeta: exceedance rate n_u / S.
        ok: False where the tail is degenerate (constant scores, too few
            exceedances) and the estimator falls back to counting.
    """

    threshold: torch.Tensor
    sigma: torch.Tensor
    xi: torch.Tensor
    zeta: torch.Tensor
    ok: torch.Tensor


def sample_weights(top: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """(Q, T) float64 multiplicity of each kept sample score (bootstrap ``weight``, else 1);
    0 for the -inf padding."""
    finite = torch.isfinite(top)
    if weight is None:
        return finite.to(torch.float64)
    return torch.where(finite, weight.to(torch.float64), torch.zeros_like(top, dtype=torch.float64))


def sample_counts(
    pos_sorted: torch.Tensor,
    valid: torch.Tensor,
    top: torch.Tensor,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled distractors scoring ≥ each positive (pessimistic ties).

    Args:
        pos_sorted: (Q, m) positive scores (NaN padding allowed).
        valid: (Q, m) real-positive mask.
        top: (Q, T) kept sample scores, sorted descending, -inf padded.
        weight: optional (Q, T) multiplicities of the kept scores.

    Returns:
        counts: (Q, m) float64 (0 at padding).
        saturated: (Q, m) bool, True where all T kept scores reach s_j, so the
            true count is only known to be ≥ the returned value.
    """
    top = top.to(torch.float64)
    T = top.shape[1]
    probe = torch.where(
        valid, pos_sorted.to(torch.float64), torch.zeros_like(pos_sorted, dtype=torch.float64)
    )
    n_ge = T - torch.searchsorted(top.flip(1).contiguous(), probe.contiguous(), side="left")
    cum = torch.cumsum(sample_weights(top, weight), dim=1)
    counts = torch.where(n_ge > 0, cum.gather(1, (n_ge - 1).clamp_min(0)), torch.zeros_like(probe))
    saturated = valid & (n_ge == T) & torch.isfinite(top[:, -1:])
    return torch.where(valid, counts, torch.zeros_like(counts)), saturated


def fit_tail(
    top: torch.Tensor,
    n_sample: int,
    weight: torch.Tensor | None = None,
    config: TailConfig = DEFAULT_CONFIG,
) -> TailFit:
    """Per-query threshold, exceedance rate and GPD fit from the kept top scores.

    Args:
        top: (Q, T) kept sample scores, sorted descending, -inf padded.
        n_sample: S, the sample size the exceedance rate is normalised by.
        weight: optional (Q, T) multiplicities (bootstrap).
        config: estimator settings.
    """
    top = top.to(torch.float64)
    n_eff = min(config.n_top, n_sample, top.shape[1])
    if config.n_excess is not None:
        n_exc = capped_excesses(config.n_excess, n_sample, top.shape[1])
    else:
        n_exc = max(1, int(round((1.0 - config.threshold_quantile) * n_eff)))
    u, has_u, excess, w_exc = threshold_excesses(top, n_exc, weight)
    # Fitted in units of each query's largest excess, so that the fit's decisions (grid
    # argmax, candidate comparisons) do not depend on the score scale: a·s + b gives
    # the same ξ and a·σ.
    scale = largest_excess(excess, w_exc)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    unit = excess / scale.unsqueeze(1)
    gpd = fit_gpd(unit, w_exc, xi_min=config.xi_min, min_excesses=config.min_excesses)
    if config.xi_max > 0:
        gpd = _with_heavy_shapes(gpd, unit, w_exc, config)
    ok = gpd.ok & has_u
    return TailFit(
        threshold=u,
        sigma=gpd.sigma * scale,
        xi=gpd.xi,
        zeta=w_exc.sum(1) / float(n_sample),
        ok=ok,
    )


def _with_heavy_shapes(gpd, excess: torch.Tensor, w_exc: torch.Tensor, config: TailConfig):
    """Replace the ξ ≤ 0 fit by the profile-likelihood maximum over ξ ∈ (0, xi_max] where higher."""
    ok = gpd.ok
    y, w = with_stand_in(excess, w_exc, ok)
    grid = torch.linspace(0.0, config.xi_max, 61, dtype=torch.float64)[1:]
    sigma, loglik = profile_on_xi_grid(y, w, grid)
    best = loglik.argmax(1, keepdim=True)
    ll = loglik.gather(1, best).squeeze(1)
    take = ok & (ll > gpd.loglik)
    return dataclasses.replace(
        gpd,
        sigma=torch.where(take, sigma.gather(1, best).squeeze(1), gpd.sigma),
        xi=torch.where(take, grid[best.squeeze(1)], gpd.xi),
        loglik=torch.where(take, ll, gpd.loglik),
    )


def threshold_excesses(
    top: torch.Tensor, n_exc: int, weight: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-query threshold after ``n_exc`` (weighted) exceedances, and the excesses over it.

    Args:
        top: (Q, T) kept sample scores, float64, sorted descending, -inf padded.
        n_exc: exceedances wanted above the threshold.
        weight: optional (Q, T) multiplicities (bootstrap).

    Returns:
        u: (Q,) the first kept score reached after n_exc exceedances;
        has_u: (Q,) False where the kept scores run out first;
        excess: (Q, W) excesses over u (≥ 0; 0 outside the exceedances);
        w_exc: (Q, W) their weights (0 outside the exceedances).
    """
    T = top.shape[1]
    w = sample_weights(top, weight)
    idx_u = (torch.cumsum(w, dim=1) <= n_exc).sum(1)
    has_u = idx_u < T
    u = top.gather(1, idx_u.clamp(max=T - 1).unsqueeze(1)).squeeze(1)
    has_u = has_u & torch.isfinite(u)
    width = max(1, int(idx_u.clamp(max=T).max()))
    head = top[:, :width]
    inside = (torch.arange(width, device=top.device).unsqueeze(0) < idx_u.unsqueeze(1)) & (
        torch.isfinite(head)
    )
    u_safe = torch.where(has_u, u, torch.zeros_like(u))
    excess = torch.where(inside, head - u_safe.unsqueeze(1), torch.zeros_like(head))
    w_exc = torch.where(inside, w[:, :width], torch.zeros_like(head))
    return u, has_u, excess.clamp_min(0.0), w_exc


def tail_hardness(pos_sorted: torch.Tensor, fit: TailFit) -> torch.Tensor:
    """EVT hardness ζ·S_GPD(s − u) for (Q, m) scores ≥ u (NaN elsewhere or where not ok)."""
    s = pos_sorted.to(torch.float64)
    y = s - fit.threshold.unsqueeze(1)
    sigma = torch.where(fit.ok, fit.sigma, torch.ones_like(fit.sigma)).unsqueeze(1)
    xi = torch.where(fit.ok, fit.xi, torch.zeros_like(fit.xi)).unsqueeze(1)
    x = fit.zeta.unsqueeze(1) * gpd_survival(y.clamp_min(0.0), sigma, xi)
    usable = fit.ok.unsqueeze(1) & (y >= 0)
    return torch.where(usable, x, torch.full_like(x, torch.nan))


def count_hardness(
    pos_sorted: torch.Tensor,
    valid: torch.Tensor,
    top: torch.Tensor,
    n_sample: int,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, None]:
    """``count``: x = K/S.

    Args:
        pos_sorted: (Q, m) positive scores, sorted descending (NaN padding).
        valid: (Q, m) real-positive mask.
        top: (Q, T) kept sample scores, sorted descending, -inf padded.
        n_sample: S.
        weight: optional (Q, T) multiplicities (bootstrap).

    Returns:
        x: (Q, m) float64 hardness (0 at padding); counts: (Q, m) sampled distractors ≥
        each positive; None (no tail fit).
    """
    counts, _ = sample_counts(pos_sorted, valid, top, weight)
    return counts / float(n_sample), counts, None


def gpd_hardness(
    pos_sorted: torch.Tensor,
    valid: torch.Tensor,
    top: torch.Tensor,
    n_sample: int,
    weight: torch.Tensor | None = None,
    config: TailConfig = DEFAULT_CONFIG,
) -> tuple[torch.Tensor, torch.Tensor, TailFit]:
    """``evt``: the fitted GPD tail where fewer than ``min_count`` sampled distractors reach a
    positive above the threshold, else the count (arguments and returns as
    :func:`count_hardness`, the fit last)."""
    x_count, counts, _ = count_hardness(pos_sorted, valid, top, n_sample, weight)
    fit = fit_tail(top, n_sample, weight, config)
    x_tail = tail_hardness(pos_sorted, fit)
    use_tail = valid & (counts < config.min_count) & ~torch.isnan(x_tail)
    x = torch.where(use_tail, x_tail, x_count)
    return x, counts, fit


def support_inputs(
    pos_sorted: torch.Tensor, top: torch.Tensor, n_sample: int, config: TailConfig
) -> tuple[torch.Tensor, torch.Tensor, TailConfig]:
    """``evt_support``'s (positives, kept scores, settings) for :func:`gpd_hardness`: the
    sample-size threshold (:func:`sample_excesses`) and the shape bound following the
    declared score range, the scores' rounding overshoot past it clipped."""
    # Scores bounded above (cosine) keep the paper's ξ ≤ 0, unbounded inner products
    # may have a heavy (ξ > 0) tail. Clipping the rounding overshoot keeps the fit off it.
    pos_sorted = clip_to_range(pos_sorted, config.score_range, "positive scores")
    top = clip_to_range(top, config.score_range, "sampled distractor scores")
    bounded = config.score_range is not None and math.isfinite(config.score_range[1])
    config = dataclasses.replace(
        config,
        xi_max=0.0 if bounded else UNBOUNDED_XI_MAX,
        n_excess=sample_excesses(n_sample, config),
    )
    return pos_sorted, top, config
