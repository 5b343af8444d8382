"""Result type, query bootstrap and input checks of the tail-extrapolated mAP@k."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from rl_gap.metrics.tail.bayes import GPDPosterior
from rl_gap.metrics.tail.hardness import TailFit
from rl_gap.metrics.tail.rank_law import RANK_LAWS

#: ``rank_law=None`` picks the estimator's own: "predictive" for tail, "plugin" otherwise.
PREDICTIVE = "predictive"

#: Every ``estimator=`` name. ``evt_support`` (the default) is the paper's plug-in
#: GPD with the shape bound following the score support (ξ ≤ 0 for scores in
#: [−1, 1], ξ ≤ 0.5 otherwise), chosen on held-out worlds (docs/tail_validation.md);
#: ``tail`` the tail-aware estimator with GPD parameter uncertainty and the
#: predictive rank law (``bayes``); ``evt`` the paper's plug-in GPD;
#: ``count`` and ``sample`` its counting and naive baselines; ``single_x``, ``powerlaw`` and ``loguniform`` its
#: homogeneous-hardness and curve-fit baselines (``baselines``).
ESTIMATORS = (
    "tail",
    "evt",
    "evt_support",
    "count",
    "sample",
    "single_x",
    "powerlaw",
    "loguniform",
)
DEFAULT_ESTIMATOR = "evt_support"
#: Estimators built on per-positive hardness (they have ``hardness`` and the budget diagnostic).
HARDNESS_ESTIMATORS = ("tail", "evt", "evt_support", "count")


@dataclass
class TailEstimate:
    """A predicted mAP@k with its uncertainty.

    Attributes:
        map: predicted mAP@k (mean over queries with ≥ 1 positive).
        ci: 95% (``confidence``) percentile interval, bootstrap over queries;
            None when asked for no interval (``n_boot=0``).
        per_query: (Q,) float64 per-query AP@k, NaN for excluded queries
            (all NaN for the curve fits, which predict only the mean).
        estimator, rank_law, gallery_size, k, sample_size: what was predicted.
        n_queries: queries with ≥ 1 positive; n_excluded: queries without.
        hardness: (Q, m) per-positive hardness, positives sorted descending
            (None for ``sample``).
        tail_ok: (Q,) bool for ``evt``/``tail``: False where the tail fit was
            degenerate and the query fell back to counting.
        fit: the per-query TailFit for ``evt``, the GPDPosterior for ``tail``.
        nested_ci: interval of the nested bootstrap (queries and distractor
            sample), when requested; sample_noise_sd: std of the prediction
            over distractor-sample resamples alone.
        budget: sufficient-budget diagnostic, when requested.
        flags: why the sample cannot support this prediction, one line per
            failed check (threshold instability of the fitted tail, the S/4–S/2–S
            sufficient-budget check; ``rl_gap.metrics.tail.diagnostics``); empty
            when every check passed or none ran.
        ci_total: ``ci`` (or ``nested_ci`` when computed) widened by the spread
            of the prediction over GPD thresholds: the interval that also carries
            the threshold (model-choice) uncertainty. None when not diagnosed, or
            with no interval to widen (``n_boot=0`` and no ``nested_ci``).
        diagnostics: the full :class:`~rl_gap.metrics.tail.diagnostics.Diagnostics`.
    """

    map: float
    ci: tuple[float, float] | None
    per_query: torch.Tensor
    estimator: str
    rank_law: str
    gallery_size: int
    k: int
    sample_size: int
    n_queries: int
    n_excluded: int
    hardness: torch.Tensor | None = None
    tail_ok: torch.Tensor | None = None
    fit: TailFit | GPDPosterior | None = None
    nested_ci: tuple[float, float] | None = None
    sample_noise_sd: float | None = None
    budget: dict | None = field(default=None)
    flags: list[str] = field(default_factory=list)
    ci_total: tuple[float, float] | None = None
    diagnostics: object | None = None

    @property
    def supported(self) -> bool:
        """False when a diagnostic check flagged the prediction (see ``flags``)."""
        return not self.flags

    def to_dict(self) -> dict:
        """JSON-friendly summary (no per-positive tensors)."""
        out = {
            "estimator": self.estimator,
            "rank_law": self.rank_law,
            "map": self.map,
            "ci": None if self.ci is None else list(self.ci),
            "gallery_size": self.gallery_size,
            "k": self.k,
            "sample_size": self.sample_size,
            "n_queries": self.n_queries,
            "n_excluded": self.n_excluded,
        }
        if self.tail_ok is not None:
            out["n_tail_fallback"] = int((~self.tail_ok).sum())
        if self.nested_ci is not None:
            out["nested_ci"] = list(self.nested_ci)
            out["sample_noise_sd"] = self.sample_noise_sd
        if self.budget is not None:
            out["budget"] = self.budget
        if self.diagnostics is not None:
            out["flags"] = list(self.flags)
            out["supported"] = self.supported
            out["ci_total"] = None if self.ci_total is None else list(self.ci_total)
            out["diagnostics"] = self.diagnostics.as_dict()
        return out


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
    idx = torch.randint(0, values.numel(), (n_boot, values.numel()), generator=generator)
    return percentile_interval(values[idx].mean(1), confidence)


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


def resolve_rank_law(estimator: str, rank_law: str | None) -> str:
    """The rank law an estimator uses: its own for ``None``; "predictive" only for tail."""
    if rank_law is None:
        return PREDICTIVE if estimator == "tail" else "plugin"
    if rank_law == PREDICTIVE and estimator != "tail":
        raise ValueError(f"rank_law 'predictive' is the tail estimator's, not {estimator!r}'s")
    if rank_law not in (*RANK_LAWS, PREDICTIVE):
        raise ValueError(
            f"unknown rank_law {rank_law!r}; known: {', '.join((*RANK_LAWS, PREDICTIVE))}"
        )
    return rank_law


def _check_common(
    gallery_size: int, sample_size: int, k: int, estimator: str, rank_law: str | None
) -> None:
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; known: {', '.join(ESTIMATORS)}")
    resolve_rank_law(estimator, rank_law)
    if int(k) < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if sample_size < 1:
        raise ValueError("the distractor sample is empty")
    if gallery_size < sample_size:
        raise ValueError(
            f"gallery_size ({gallery_size}) must be >= the distractor sample size ({sample_size}): "
            "the estimators extrapolate to larger galleries"
        )


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
