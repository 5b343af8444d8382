"""Tail-extrapolated mAP@k: predict a web-scale gallery's metric from a small sample.

*Web Scale on a Budget: Tail-Aware Retrieval Evaluation* (Meivar & Avidan):
the distractors outranking a positive are Binomial(N, x) with a per-positive
hardness x that does not depend on the gallery size N, so hardness estimated
from an i.i.d. distractor sample of size S predicts AP@k at any N (docs/definitions.md,
"Per-query hardness"). Entry points:

```python
from rl_gap.metrics.tail import predict_map
est = predict_map(pos_scores, sample_scores, gallery_size=N, k=1000, estimator="evt")
est.map, est.ci, est.per_query
```

and :class:`TailPredictor` for the streaming state (:class:`NestedTopK`) that
the torchmetrics class and ``rl-gap extrapolate`` fill without holding Q × S.
"""

from __future__ import annotations

import math
import warnings

import torch

from rl_gap.metrics.tail_estimate import (  # noqa: F401  (public re-exports)
    ESTIMATORS,
    TailEstimate,
    _check_common,
    bootstrap_ci,
    check_positive_scores,
)
from rl_gap.metrics.tail_hardness import (
    DEFAULT_CONFIG,
    TailConfig,
    TailFit,
    estimate_hardness,
    sample_counts,
)
from rl_gap.metrics.tail_rank import (
    ap_at_k_from_counts,
    ap_at_k_from_hardness,
    sort_positives,
)
from rl_gap.metrics.tail_sampling import DEFAULT_FRACTIONS, NestedTopK

__all__ = [
    "ESTIMATORS",
    "TailConfig",
    "TailEstimate",
    "TailPredictor",
    "bootstrap_ci",
    "predict_map",
]


def __getattr__(name: str):
    # The torchmetrics class lives in tail_metric (it imports this module); lazy re-export.
    if name == "TailExtrapolatedMAP":
        from rl_gap.metrics.tail_metric import TailExtrapolatedMAP

        return TailExtrapolatedMAP
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TailPredictor:
    """Predictions at any gallery size from positives and a nested top-T sample state.

    Args:
        pos_scores: (Q, m) positive scores, NaN-padded.
        state: the per-query top-T sample scores (full sample = last level).
        k: AP cut-off.
        config: EVT settings.
        seed: bootstrap seed.
    """

    def __init__(
        self,
        pos_scores: torch.Tensor,
        state: NestedTopK,
        k: int,
        config: TailConfig = DEFAULT_CONFIG,
        seed: int = 0,
    ) -> None:
        check_positive_scores(pos_scores, state.n_queries)
        if int(k) < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if state.capacity < k:
            raise ValueError(f"the state keeps {state.capacity} scores per query; need >= k = {k}")
        self.k = int(k)
        self.config = config
        self.state = state
        self.seed = seed
        self.pos_sorted, self.valid, self.j = sort_positives(pos_scores)
        self.query_ok = self.valid.any(1)
        self.sample_size = int(state.seen.sum())
        self._levels: dict[int, tuple[torch.Tensor, int]] = {}
        self._hardness: dict[
            tuple[str, int], tuple[torch.Tensor, torch.Tensor, TailFit | None]
        ] = {}

    @property
    def n_queries_valid(self) -> int:
        return int(self.query_ok.sum())

    @property
    def n_excluded(self) -> int:
        return int((~self.query_ok).sum())

    def level(self, index: int = -1) -> tuple[torch.Tensor, int]:
        """(top (Q, T) sorted descending, size) of nested sub-sample ``index``."""
        index = index % len(self.state.fractions)
        if index not in self._levels:
            self._levels[index] = self.state.level(index)
        return self._levels[index]

    def hardness(
        self, estimator: str, level: int = -1, weight: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, TailFit | None]:
        """(x, counts, fit) for ``count``/``evt`` on nested level ``level``."""
        key = (estimator, level % len(self.state.fractions))
        if weight is None and key in self._hardness:
            return self._hardness[key]
        top, n = self.level(level)
        out = estimate_hardness(estimator, self.pos_sorted, self.valid, top, n, weight, self.config)
        if weight is None:
            self._hardness[key] = out
        return out

    def per_query(
        self,
        estimator: str,
        gallery_size: int,
        rank_law: str = "plugin",
        level: int = -1,
        weight: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(Q,) per-query AP@k; NaN for queries without positives."""
        if estimator == "sample":
            top, _ = self.level(level)
            counts, _ = sample_counts(self.pos_sorted, self.valid, top, weight)
            ap = ap_at_k_from_counts(self.j, self.valid, counts, self.k)
        else:
            x, _, _ = self.hardness(estimator, level, weight)
            ap = ap_at_k_from_hardness(self.j, self.valid, x, gallery_size, self.k, rank_law)
        return torch.where(self.query_ok, ap, torch.full_like(ap, math.nan))

    def _generator(self, offset: int = 0) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed + offset)

    def estimate(
        self,
        estimator: str,
        gallery_size: int,
        rank_law: str = "plugin",
        n_boot: int = 1000,
        confidence: float = 0.95,
        nested_boot: int = 0,
        budget: bool = False,
    ) -> TailEstimate:
        """Predicted mAP@k at ``gallery_size`` with a query-bootstrap interval.

        Args:
            estimator: "sample" (metric of the sample gallery itself, N = S),
                "count" or "evt".
            gallery_size: N to predict for (≥ S).
            rank_law: "plugin", "binomial" or "poisson" (see tail_rank).
            n_boot: query-bootstrap replicates.
            confidence: interval mass.
            nested_boot: if > 0, also resample the distractor sample
                (Poisson(1) multiplicities of the kept scores) this many times,
                jointly with the queries, for ``nested_ci``.
            budget: add the sufficient-budget diagnostic (S/4, S/2, S).
        """
        _check_common(gallery_size, self.sample_size, self.k, estimator, rank_law)
        if estimator == "evt" and self.sample_size < self.config.n_top:
            warnings.warn(
                f"distractor sample ({self.sample_size}) is smaller than the EVT's top "
                f"{self.config.n_top}; using all sampled scores",
                stacklevel=3,
            )
        per_query = self.per_query(estimator, gallery_size, rank_law)
        valid_q = per_query[self.query_ok]
        if valid_q.numel() == 0:
            raise ValueError("no query has a positive: nothing to evaluate")
        ci = bootstrap_ci(per_query, n_boot, confidence, self._generator())
        est = TailEstimate(
            map=float(valid_q.mean()),
            ci=ci,
            per_query=per_query,
            estimator=estimator,
            rank_law=rank_law if estimator != "sample" else "realized",
            gallery_size=int(gallery_size) if estimator != "sample" else self.sample_size,
            k=self.k,
            sample_size=self.sample_size,
            n_queries=int(valid_q.numel()),
            n_excluded=self.n_excluded,
        )
        if estimator != "sample":
            est.hardness, _, est.fit = self.hardness(estimator)
            if est.fit is not None:
                est.tail_ok = est.fit.ok
        if nested_boot > 0:
            est.nested_ci, est.sample_noise_sd = self._nested(
                estimator, gallery_size, rank_law, nested_boot, confidence
            )
        if budget:
            est.budget = self.budget(estimator, gallery_size, rank_law, n_boot, confidence, ci)
        return est

    def _nested(
        self, estimator: str, gallery_size: int, rank_law: str, n_rep: int, confidence: float
    ) -> tuple[tuple[float, float], float]:
        gen = self._generator(1)
        top, _ = self.level(-1)
        finite = torch.isfinite(top)
        rows = self.query_ok.nonzero().squeeze(1)
        joint, sample_only = [], []
        for _ in range(n_rep):
            weight = torch.poisson(finite.to(torch.float64), generator=gen)
            pq = self.per_query(estimator, gallery_size, rank_law, weight=weight)[rows]
            sample_only.append(pq.mean())
            pick = torch.randint(0, rows.numel(), (rows.numel(),), generator=gen)
            joint.append(pq[pick].mean())
        joint_t = torch.stack(joint)
        alpha = (1.0 - confidence) / 2.0
        lo, hi = torch.quantile(joint_t, torch.tensor([alpha, 1.0 - alpha], dtype=torch.float64))
        return (float(lo), float(hi)), float(torch.stack(sample_only).std())

    def budget(
        self,
        estimator: str,
        gallery_size: int,
        rank_law: str = "plugin",
        n_boot: int = 1000,
        confidence: float = 0.95,
        ci: tuple[float, float] | None = None,
    ) -> dict:
        """Sufficient-budget diagnostic (paper App. D).

        Predictions from the nested sub-samples S/4, S/2 and S side by side;
        ``converged`` when their spread (max − min) is below the query
        noise, the half-width of the query-bootstrap interval at S.
        """
        fractions = self.state.fractions
        picks = [
            i for i, f in enumerate(fractions) if any(abs(f - g) < 1e-9 for g in (0.25, 0.5, 1.0))
        ]
        rows = []
        for i in picks:
            _, n = self.level(i)
            pq = self.per_query(estimator, max(gallery_size, n), rank_law, level=i)
            rows.append(
                {"fraction": fractions[i], "sample_size": n, "map": float(pq[self.query_ok].mean())}
            )
        if ci is None:
            ci = bootstrap_ci(
                self.per_query(estimator, gallery_size, rank_law),
                n_boot,
                confidence,
                self._generator(),
            )
        noise = (ci[1] - ci[0]) / 2.0
        maps = [r["map"] for r in rows]
        spread = max(maps) - min(maps) if maps else math.nan
        return {"levels": rows, "spread": spread, "noise": noise, "converged": bool(spread < noise)}

    def curve(
        self,
        estimator: str,
        sizes: list[int],
        rank_law: str = "plugin",
        n_boot: int = 500,
        confidence: float = 0.95,
    ) -> tuple[list[float], list[float], list[float]]:
        """Predicted mAP@k and interval at each gallery size (hardness computed once)."""
        maps, los, his = [], [], []
        for n in sizes:
            pq = self.per_query(estimator, int(n), rank_law)
            lo, hi = bootstrap_ci(pq, n_boot, confidence, self._generator())
            maps.append(float(pq[self.query_ok].mean()))
            los.append(lo)
            his.append(hi)
        return maps, los, his

    def measured(self, n_boot: int = 500, confidence: float = 0.95) -> list[dict]:
        """The metric measured on each nested sub-sample gallery (S/8 … S)."""
        out = []
        for i, f in enumerate(self.state.fractions):
            _, n = self.level(i)
            if n == 0:
                continue
            pq = self.per_query("sample", n, level=i)
            lo, hi = bootstrap_ci(pq, n_boot, confidence, self._generator())
            out.append(
                {
                    "fraction": f,
                    "sample_size": n,
                    "map": float(pq[self.query_ok].mean()),
                    "ci": [lo, hi],
                }
            )
        return out


def state_from_scores(
    sample_scores: torch.Tensor, capacity: int, fractions: tuple[float, ...] = DEFAULT_FRACTIONS
) -> NestedTopK:
    """Top-T state of a full (Q, S) sample score matrix; nested levels are column prefixes."""
    if not isinstance(sample_scores, torch.Tensor) or sample_scores.dim() != 2:
        raise ValueError(
            f"sample_scores must be a (Q, S) tensor, got {getattr(sample_scores, 'shape', type(sample_scores))}"
        )
    if not sample_scores.is_floating_point():
        raise ValueError(f"sample_scores must be floating point, got {sample_scores.dtype}")
    Q, S = sample_scores.shape
    if S == 0:
        raise ValueError("the distractor sample is empty (sample_scores has 0 columns)")
    dtype = torch.float64 if sample_scores.dtype == torch.float64 else torch.float32
    state = NestedTopK(Q, capacity, fractions, dtype=dtype)
    bounds = [0] + [int(round(f * S)) for f in fractions]
    for p in range(len(fractions)):
        for start in range(bounds[p], bounds[p + 1], 65536):
            block = sample_scores[:, start : min(bounds[p + 1], start + 65536)]
            if not bool(torch.isfinite(block).all()):
                raise ValueError("sample_scores contains NaN or ±inf")
            state.push(block, p)
    return state


def predict_map(
    pos_scores: torch.Tensor,
    sample_scores: torch.Tensor,
    gallery_size: int,
    k: int = 1000,
    estimator: str = "evt",
    *,
    rank_law: str = "plugin",
    n_boot: int = 1000,
    confidence: float = 0.95,
    nested_boot: int = 0,
    budget: bool = False,
    config: TailConfig = DEFAULT_CONFIG,
    seed: int = 0,
) -> TailEstimate:
    """Predict mAP@k at gallery size N from a distractor sample (docs/definitions.md).

    Args:
        pos_scores: (Q, m) positive scores per query, NaN-padded; queries with
            no positive are excluded (and counted in ``n_excluded``).
        sample_scores: (Q, S) scores of an i.i.d. distractor sample (in random
            order: its prefixes serve as the nested sub-samples).
        gallery_size: N, the number of distractors to predict for (≥ S).
        k: AP cut-off (≥ 1).
        estimator: "sample", "count" or "evt".
        rank_law: "plugin" expected ranks (paper) or "binomial"/"poisson" E[AP@k].
        n_boot: query-bootstrap replicates for ``ci``.
        confidence: interval mass (0.95).
        nested_boot: replicates of the nested (queries × sample) bootstrap; 0 = off.
        budget: add the S/4, S/2, S sufficient-budget diagnostic.
        config: EVT settings (top 4000, 95th percentile, < 5 count rule).
        seed: bootstrap seed.

    Returns:
        TailEstimate with ``map``, ``ci``, ``per_query`` and diagnostics.
    """
    check_positive_scores(pos_scores)
    if not isinstance(sample_scores, torch.Tensor) or sample_scores.dim() != 2:
        raise ValueError(
            f"sample_scores must be a (Q, S) tensor, got {getattr(sample_scores, 'shape', type(sample_scores))}"
        )
    check_positive_scores(pos_scores, sample_scores.shape[0])
    _check_common(gallery_size, sample_scores.shape[1], k, estimator, rank_law)
    state = state_from_scores(sample_scores, max(int(k), config.n_top))
    predictor = TailPredictor(pos_scores, state, k, config, seed)
    return predictor.estimate(
        estimator, gallery_size, rank_law, n_boot, confidence, nested_boot, budget
    )
