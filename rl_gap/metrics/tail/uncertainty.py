"""How far the default prediction may be off for *these* queries: its interval and its flags.

A user asks "what is mAP@k of my queries at N". For a fixed query set the
prediction errs through the distractor sample (another sample of S gives
another prediction) and through the estimator's own choices the sample does
not pin down (how deep the tail threshold sits). The query-resampling
interval answers a different question (other queries of the same kind) and is
kept as ``TailEstimate.ci_over_queries``.

- **Sample noise**: ``REPLICATES`` predictions on the distractor sample
  resampled (Poisson(1) multiplicities; with a keyed state one multiplicity per
  distractor, shared by every query it scores high for), the queries fixed:
  their standard deviation. The replicates and refits use a cheap proxy of the
  prediction: its posterior-mean hardness on a 21-point ξ grid through the
  plug-in ranks (the spread, not the level, is what they measure).
- **Threshold**: the prediction refitted at half and twice its exceedances;
  the larger move from the refit at its own (on the same proxy).
- The interval is ``map ± z · INFLATION · sqrt(sd_sample² + move²)``.
  ``INFLATION`` accounts for what neither measures (the tail's shape far past
  the sample, the pool's own realization) and was set on design families of
  worlds only (docs/tail_validation.md, "Generated families").

Flags say "may be off by more than X": they fire when the interval's
half-width exceeds ``FLAG_HALF_WIDTH`` (set on the design families for recall
of errors above X), and when a bump of outlying top scores suggests rare
near-copies the sample barely sees (``diagnostics.tail_outlier_share``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from statistics import NormalDist
from typing import TYPE_CHECKING

import torch

from rl_gap.metrics.tail.diagnostics import check_bump
from rl_gap.metrics.tail.rank_law import ap_at_k_from_hardness
from rl_gap.metrics.tail.results import Diagnostics
from rl_gap.metrics.tail.sampling import poisson_multiplicities

if TYPE_CHECKING:
    from rl_gap.metrics.tail.registry import Estimator
    from rl_gap.metrics.tail.view import TailView

#: Distractor-sample replicates of the fixed-query interval.
REPLICATES = 12
#: Exceedance factors of the threshold refits (half and twice the estimator's own).
THRESHOLD_FACTORS = (0.5, 2.0)
#: Widening of the measured spread to what the prediction errs by (design families).
INFLATION = 1.30
#: The error a flag warns about ("may be off by more than X").
FLAG_ERROR = 0.03
#: Flag when the interval's half-width exceeds this (design families).
FLAG_HALF_WIDTH = 0.13


def resampled_weights(
    view: TailView, replicates: int, generator: torch.Generator, first_key: int = 0
) -> Iterator[torch.Tensor]:
    """(Q, T) Poisson(1) multiplicities of the full sample's kept scores, one per replicate.

    With a keyed state a distractor gets one multiplicity for every query (one
    distractor that ranks high for many queries moves them all; replicate b hashes
    key ``first_key + b``); otherwise each query's kept scores are resampled on their
    own from ``generator``. Drawn lazily, so a caller may draw from ``generator`` between
    replicates.
    """
    top, _ = view.level(-1)
    keys = view.level_keys(-1)
    finite = torch.isfinite(top).to(torch.float64)
    for b in range(replicates):
        if keys is None:
            yield torch.poisson(finite, generator=generator)
        else:
            yield poisson_multiplicities(keys, first_key + b, view.seed) * finite


def joint_bootstrap(
    view: TailView,
    estimator: Estimator,
    gallery_size: int,
    rank_law: str,
    n_rep: int,
    confidence: float,
    per_query: torch.Tensor,
) -> tuple[tuple[float, float], float]:
    """(interval, distractor-sample sd) resampling queries and the distractor sample together
    (:func:`resampled_weights`). ``rank_law`` is the estimator's resolved law
    (``inputs.resolve_request``)."""
    gen = view.generator(1)
    rows = view.query_ok.nonzero().squeeze(1)
    # An expensive estimator's replicates may run cheaper settings and carry each
    # query's difference to the full prediction.
    fast = estimator.replicate_settings(view, rank_law)
    shift = 0.0
    if fast is not None:
        plain = estimator.ap(view, gallery_size, rank_law, bayes=fast)
        shift = (per_query - plain)[rows]
    estimate = float(per_query[rows].mean())
    joint, sample_only = [], []
    for weight in resampled_weights(view, n_rep, gen):
        pq = estimator.ap(view, gallery_size, rank_law, weight=weight, bayes=fast)
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


def sample_replicates(
    view: TailView,
    estimator: Estimator,
    gallery_size: int,
    rank_law: str,
    replicates: int = REPLICATES,
) -> torch.Tensor:
    """(R,) mAP@k of the fixed queries on ``replicates`` resamples of the distractor sample."""
    weights = resampled_weights(view, replicates, view.generator(7), first_key=1000)
    out = [_plugin_map(view, estimator, gallery_size, weight, 1.0) for weight in weights]
    return torch.stack(out).to(torch.float64)


def threshold_moves(
    view: TailView, estimator: Estimator, gallery_size: int, rank_law: str
) -> dict[float, float]:
    """{factor: mAP@k refitted at factor × the estimator's exceedances}, for 1 and each of
    THRESHOLD_FACTORS (all on the estimator's coarse settings, so their moves compare)."""
    return {
        f: float(_plugin_map(view, estimator, gallery_size, None, f))
        for f in (1.0, *THRESHOLD_FACTORS)
    }


def _plugin_map(view, estimator, gallery_size: int, weight, factor: float) -> torch.Tensor:
    """mAP@k of the estimator's posterior-mean hardness through the plug-in ranks, on its
    coarse settings: the cheap proxy whose spread over resamples and thresholds the
    interval measures (the predictive law sums a negative binomial per positive up to k)."""
    x, _, _ = estimator.hardness(view, -1, weight, factor=factor, coarse=True)
    ap = ap_at_k_from_hardness(view.j, view.valid, x, gallery_size, view.k, "plugin")
    return ap[view.query_ok].mean()


def fixed_query_uncertainty(
    view: TailView,
    estimator: Estimator,
    gallery_size: int,
    rank_law: str,
    estimate: float,
    confidence: float = 0.95,
    replicates: int = REPLICATES,
    inflation: float = INFLATION,
) -> dict:
    """The fixed-query interval's parts: {"ci", "half_width", "sample_sd", "threshold_move",
    "threshold_maps"} (module docstring)."""
    reps = sample_replicates(view, estimator, gallery_size, rank_law, replicates)
    sample_sd = float(reps.std()) if reps.numel() > 1 else 0.0
    maps = threshold_moves(view, estimator, gallery_size, rank_law)
    move = max(abs(v - maps[1.0]) for v in maps.values())
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    half = z * inflation * math.sqrt(sample_sd**2 + move**2)
    return {
        "ci": (max(0.0, estimate - half), min(1.0, estimate + half)),
        "half_width": half,
        "sample_sd": sample_sd,
        "threshold_move": move,
        "threshold_maps": maps,
    }


def error_flags(
    view: TailView,
    gallery_size: int,
    parts: dict,
    bump_hardness: Callable[[], torch.Tensor],
    flag_half_width: float = FLAG_HALF_WIDTH,
) -> Diagnostics:
    """Flags of the default prediction, each saying by how much it may be off (``parts``:
    :func:`fixed_query_uncertainty`; ``bump_hardness``: the hardness a bump raises,
    ``Estimator.bump_hardness``, built only when there is a bump)."""
    out = Diagnostics()
    out.threshold_maps = {f"x{f:g}": v for f, v in parts["threshold_maps"].items()}
    values = list(parts["threshold_maps"].values())
    out.threshold_spread = max(values) - min(values)
    if parts["half_width"] > flag_half_width:
        out.flags.append(
            f"may be off by more than {FLAG_ERROR:.2f}: the sample's noise (sd "
            f"{parts['sample_sd']:.3f}) and the tail threshold (moves {parts['threshold_move']:.3f})"
            f" give ±{parts['half_width']:.3f}"
        )
    check_bump(
        out, view, gallery_size,
        lambda share, bound: f"may be off by more than {FLAG_ERROR:.2f}: {share:.0%} of queries "
        "have a top sampled score apart from their tail (rare near-copies? the pool holds N/S "
        f"times more); if every query had them above its positives: mAP@{view.k} {bound:.3f}",
        bump_hardness,
    )  # fmt: skip
    return out
