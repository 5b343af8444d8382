"""What a tail prediction returns: :class:`TailEstimate` and its :class:`Diagnostics`."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rl_gap.metrics.tail.bayes import GPDPosterior
from rl_gap.metrics.tail.hardness import TailFit


@dataclass
class Diagnostics:
    """What the sample can and cannot support about a prediction.

    Attributes:
        flags: one line per failed check (empty: supported).
        threshold_maps: {n: mAP@k of ``evt`` fitted to n exceedances}.
        threshold_spread: max − min of ``threshold_maps``.
        shape_shift: median ξ at the deepest minus the shallowest threshold.
        budget_spread, budget_noise: the sufficient-budget check's spread and noise
            (NaN when not run).
    """

    flags: list[str] = field(default_factory=list)
    threshold_maps: dict[int, float] = field(default_factory=dict)
    threshold_spread: float = float("nan")
    shape_shift: float = float("nan")
    budget_spread: float = float("nan")
    budget_noise: float = float("nan")
    outlier_share: float = float("nan")
    bump_bound: float | None = None

    @property
    def supported(self) -> bool:
        return not self.flags

    def widen(self, ci: tuple[float, float] | None) -> tuple[float, float] | None:
        """``ci`` extended to cover every threshold's prediction ± the interval's own widths,
        and down to ``bump_bound`` when set (None without an interval)."""
        if ci is None or not self.threshold_maps:
            return ci
        lo_t, hi_t = min(self.threshold_maps.values()), max(self.threshold_maps.values())
        centre = 0.5 * (ci[0] + ci[1])
        lo, hi = min(ci[0], lo_t - (centre - ci[0])), max(ci[1], hi_t + (ci[1] - centre))
        # A bump above the tail: down to the mAP if every query had it.
        return (lo if self.bump_bound is None else min(lo, self.bump_bound), hi)

    def widen_to_bump(self, ci: tuple[float, float] | None) -> tuple[float, float] | None:
        """``ci`` extended down to ``bump_bound`` when set."""
        if ci is None or self.bump_bound is None:
            return ci
        return (min(ci[0], self.bump_bound), ci[1])

    def as_dict(self) -> dict:
        return {
            "flags": list(self.flags),
            "supported": self.supported,
            "threshold_maps": {str(n): v for n, v in self.threshold_maps.items()},
            "threshold_spread": self.threshold_spread,
            "shape_shift": self.shape_shift,
            "budget_spread": self.budget_spread,
            "budget_noise": self.budget_noise,
            "outlier_share": self.outlier_share,
            "bump_bound": self.bump_bound,
        }


@dataclass
class TailEstimate:
    """A predicted mAP@k with its uncertainty.

    Attributes:
        map: predicted mAP@k (mean over queries with ≥ 1 positive).
        ci: 95% (``confidence``) interval. For the default estimator
            (``tail_pooled``) it is the interval for these queries: the
            distractor sample resampled and the tail threshold refitted
            (``uncertainty``). For the others it is ``ci_over_queries``.
            None when asked for no interval (``n_boot=0``).
        ci_over_queries: 95% percentile interval of a bootstrap over queries
            (per-query AP@k fixed): how much another query set of the same kind
            would move the prediction, not how far it is from these queries' truth.
        uncertainty: the default's fixed-query interval parts ("half_width",
            "sample_sd", "threshold_move", "threshold_maps"); None otherwise.
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
        diagnostics: the full :class:`Diagnostics`.
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
    diagnostics: Diagnostics | None = None
    ci_over_queries: tuple[float, float] | None = None
    uncertainty: dict | None = None

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
            "ci_over_queries": None if self.ci_over_queries is None else list(self.ci_over_queries),
            "gallery_size": self.gallery_size,
            "k": self.k,
            "sample_size": self.sample_size,
            "n_queries": self.n_queries,
            "n_excluded": self.n_excluded,
        }
        if self.tail_ok is not None:
            out["n_tail_fallback"] = int((~self.tail_ok).sum())
        if self.uncertainty is not None:
            out["uncertainty"] = {
                "half_width": self.uncertainty["half_width"],
                "sample_sd": self.uncertainty["sample_sd"],
                "threshold_move": self.uncertainty["threshold_move"],
            }
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
