"""Tail-extrapolated mAP@k: predict a web-scale gallery's metric from a small sample.

*Web Scale on a Budget: Tail-Aware Retrieval Evaluation* (Meivar & Avidan):
the distractors outranking a positive are Binomial(N, x) with a per-positive
hardness x that does not depend on the gallery size N, so hardness estimated
from an i.i.d. distractor sample of size S predicts AP@k at any N (docs/definitions.md,
"Per-query hardness"). Entry points:

```python
from rl_gap.metrics.tail import predict_map
est = predict_map(pos_scores, sample_scores, gallery_size=N, k=1000)  # DEFAULT_ESTIMATOR
est.map, est.ci, est.per_query
```

Estimators (``docs/tail_extrapolation.md``, ``docs/tail_validation.md``):
``evt_support`` (default; the paper's plug-in GPD with the shape bound following
the score support), ``tail`` (GPD tail with parameter uncertainty and the
predictive rank law), ``evt`` (the paper's plug-in GPD), ``count``, ``sample`` and the paper's baselines ``single_x``,
``powerlaw``, ``loguniform``.

and :class:`TailPredictor` for the streaming state (:class:`NestedTopK`) that
the torchmetrics class and ``rl-gap extrapolate`` fill without holding Q × S.
"""

from __future__ import annotations

import torch

from rl_gap.metrics.tail.bayes import DEFAULT_BAYES, BayesTailConfig
from rl_gap.metrics.tail.build import state_capacity, tail_predictor, with_score_range
from rl_gap.metrics.tail.hardness import DEFAULT_CONFIG, TailConfig
from rl_gap.metrics.tail.inputs import EstimateRequest, check_sample_matrix, resolve_request
from rl_gap.metrics.tail.pipeline import run
from rl_gap.metrics.tail.registry import DEFAULT_ESTIMATOR
from rl_gap.metrics.tail.results import TailEstimate
from rl_gap.metrics.tail.sampling import DEFAULT_FRACTIONS, NestedTopK


def state_from_scores(
    sample_scores: torch.Tensor,
    capacity: int,
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS,
    keyed: bool = False,
    seed: int = 0,
    shuffle: bool = True,
) -> NestedTopK:
    """Top-T state of a full (Q, S) sample score matrix with nested random sub-samples.

    The columns are permuted with ``seed`` first and the nested levels
    (S/8 ⊂ S/4 ⊂ S/2 ⊂ S) are prefixes of that permutation: a sample handed
    over in a non-random column order (sorted, grouped by source) would
    otherwise give sub-samples that are not random, and break the curve fits
    and the sufficient-budget check that compare them.

    ``keyed``: key each kept score by its (original) column (column j is one
    distractor for every query), for the joint nested bootstrap.
    ``shuffle=False`` keeps the column order (levels are plain prefixes): only
    for columns already in random order, or to build non-exchangeable levels on purpose.
    """
    check_sample_matrix(sample_scores)
    return NestedTopK.from_matrix(sample_scores, capacity, fractions, keyed, seed, shuffle)


def predict_map(
    pos_scores: torch.Tensor,
    sample_scores: torch.Tensor,
    gallery_size: int,
    k: int = 1000,
    estimator: str = DEFAULT_ESTIMATOR,
    *,
    rank_law: str | None = None,
    n_boot: int = EstimateRequest.n_boot,
    confidence: float = EstimateRequest.confidence,
    nested_boot: int = EstimateRequest.nested_boot,
    budget: bool = EstimateRequest.budget,
    config: TailConfig = DEFAULT_CONFIG,
    seed: int = 0,
    bayes: BayesTailConfig = DEFAULT_BAYES,
    score_range: str | tuple[float, float] | None = "cosine",
) -> TailEstimate:
    """Predict mAP@k at gallery size N from a distractor sample (docs/definitions.md).

    Args:
        pos_scores: (Q, m) positive scores per query, NaN-padded; queries with
            no positive are excluded (and counted in ``n_excluded``).
        sample_scores: (Q, S) scores of an i.i.d. distractor sample (any column
            order: the nested sub-samples are prefixes of a seeded permutation).
        gallery_size: N, the number of distractors to predict for (≥ S).
        k: AP cut-off (≥ 1).
        estimator: "tail_pooled" (default: the GPD shape's posterior pooled across
            queries; ``ci`` is then the interval for these queries and the flags say
            by how much it may be off), "evt_support" (plug-in GPD, ξ bound
            following the score support), "tail" (GPD with parameter uncertainty,
            predictive E[AP@k]), "evt" (the paper's plug-in GPD), "count",
            "sample", or the baselines "single_x", "powerlaw", "loguniform".
        rank_law: None = the estimator's own ("predictive" for tail, "plugin"
            otherwise); "plugin" expected ranks (paper) or "binomial"/"poisson" E[AP@k].
        n_boot: query-bootstrap replicates for ``ci``.
        confidence: interval mass (0.95).
        nested_boot: replicates of the joint bootstrap (queries resampled, and
            the distractor sample resampled once for all queries: column j is
            one distractor); 0 = off. Gives ``nested_ci`` and ``sample_noise_sd``.
        budget: add the S/4, S/2, S sufficient-budget diagnostic.
        config: EVT settings (top 4000, 95th percentile, < 5 count rule).
        seed: bootstrap seed, and the seed of the column permutation.
        bayes: settings of the ``tail`` estimator.
        score_range: the declared range of the similarity: "cosine" (default,
            [−1, 1]: only for cosine similarities of unit-normalised embeddings),
            "dot" or None (inner products of any other embeddings, even when
            their values lie in [−1, 1]), or a (low, high)
            pair (e.g. the range mapped with the scores). ``evt_support`` bounds
            the tail shape by it (replaces ``config.score_range``); scores past it by
            rounding are clipped, further out refused. Never guessed from the data.

    Returns:
        TailEstimate with ``map``, ``ci``, ``per_query`` and diagnostics.

    Example:
        One query with two positives (0.95, 0.5) and a sample of S = 10
        distractors, one of which (0.9) lies between them. The ``count``
        estimator gives the second positive hardness x = 1/10, so in a
        gallery of N distractors it sits at rank 2 + N·x: AP@10 is
        (1 + 2/3)/2 at N = S = 10 and (1 + 2/4)/2 at N = 20:

        >>> import torch
        >>> from rl_gap.metrics.tail import predict_map
        >>> pos = torch.tensor([[0.95, 0.5]])
        >>> sample = torch.tensor([[0.9, 0.4, 0.3, 0.2, 0.1, 0.0, -0.1, -0.2, -0.3, -0.4]])
        >>> est = predict_map(pos, sample, gallery_size=10, k=10, estimator="count")
        >>> round(est.map, 4)
        0.8333
        >>> est = predict_map(pos, sample, gallery_size=20, k=10, estimator="count")
        >>> round(est.map, 4), est.sample_size, est.hardness
        (0.75, 10, tensor([[0.0000, 0.1000]], dtype=torch.float64))
    """
    check_sample_matrix(sample_scores)
    # k is checked with the positives, by the predictor.
    request = resolve_request(
        estimator, gallery_size, sample_scores.shape[1], rank_law=rank_law, n_boot=n_boot,
        confidence=confidence, nested_boot=nested_boot, budget=budget,
    )  # fmt: skip
    config = with_score_range(config, score_range)
    # Keyed columns: a resampled distractor moves every query it scores for (the joint
    # bootstrap, and the default's fixed-query interval).
    keyed = nested_boot > 0 or (n_boot > 0 and request.estimator.fixed_query_interval)
    capacity = state_capacity(k, config)
    state = NestedTopK.from_matrix(sample_scores, capacity, DEFAULT_FRACTIONS, keyed, seed, True)
    predictor = tail_predictor(pos_scores, state, k, config=config, seed=seed, bayes=bayes)
    return run(predictor, request)
