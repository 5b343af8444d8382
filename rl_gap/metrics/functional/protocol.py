"""The shared-threshold protocol (gSAP paper §C.3), each half its own retrieval problem.

The classes are split at random (seeded) into two halves. Each half is a retrieval
problem of its own: the queries of its classes ranked against the database items
of its classes only (items of the other half are neither positives nor negatives).
Thresholds are fitted on the first half's problem (*fit*) and reported on the
second's (*eval*):

- ``f1g``: eval F1 at the shared threshold maximising the fit F1;
- ``r@p90``: eval recall at the fit threshold that reaches precision 0.90 with the
  largest recall;
- ``f1q``: mean over the eval queries of each query's best-threshold F1.

The eval problem is built with the fitted thresholds added to its score grid, so
its counts at them are exact. See docs/metrics_engine.md for a worked example.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rl_gap.metrics.functional import ranking
from rl_gap.metrics.functional.arguments import check_precisions, precision_tag
from rl_gap.metrics.functional.state import RetrievalState

__all__ = [
    "split_classes",
    "protocol_halves",
    "fit_thresholds",
    "threshold_protocol_from_states",
    "protocol_states",
]


def _class_halves(classes: Tensor, seed: int) -> Tensor:
    """(C,) int64 half (0 fit, 1 eval) of each of ``classes`` (sorted distinct)."""
    generator = torch.Generator().manual_seed(seed)
    perm = torch.randperm(classes.numel(), generator=generator)
    half = torch.zeros(classes.numel(), dtype=torch.long)
    half[perm[classes.numel() // 2 :]] = 1
    return half


def split_classes(labels: Tensor, seed: int = 0) -> Tensor:
    """(N,) int64: 0 for items of a random half of the classes (fit), 1 for the rest (eval)."""
    classes, inverse = torch.unique(labels.cpu(), return_inverse=True)
    return _class_halves(classes, seed)[inverse]


def protocol_halves(
    query_labels: Tensor, database_labels: Tensor, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Halves ((Q,), (D,) int64, 0 fit / 1 eval) of queries and database items.

    The query classes are split (``split_classes``); a database item of a query
    class follows its class; database-only classes (pure distractors) are split
    at random on their own, so each half keeps its share of them.

    Raises:
        ValueError: fewer than two query classes (nothing to fit on or report on).
    """
    query_labels, database_labels = query_labels.cpu().long(), database_labels.cpu().long()
    classes = torch.unique(query_labels)
    if classes.numel() < 2:
        raise ValueError(
            "the threshold protocol splits the query classes in two halves (fit, eval); "
            f"got {classes.numel()} query class(es): it needs at least 2"
        )
    class_half = _class_halves(classes, seed)
    q_half = class_half[torch.searchsorted(classes, query_labels)]
    d_half = torch.empty_like(database_labels)
    shared = torch.isin(database_labels, classes)
    d_half[shared] = class_half[torch.searchsorted(classes, database_labels[shared])]
    if bool((~shared).any()):
        d_half[~shared] = split_classes(database_labels[~shared], seed + 1)
    return q_half, d_half


def fit_thresholds(fit: RetrievalState, precisions: tuple[float, ...]) -> dict[str, Tensor]:
    """Shared thresholds fitted on ``fit``: ``"f1"`` (best F1) and ``"p{tag}"`` per level
    (largest recall at precision >= the level; +inf when none reaches it).

    Raises:
        ValueError: the fit problem has no positive pair (no threshold to fit).
    """
    if fit.pos_scores.numel() == 0:
        raise ValueError(
            "threshold protocol: the fit half has no positive pair (every class of it is a "
            "singleton), so no threshold can be fitted"
        )
    out = {"f1": ranking.global_f1_from_state(fit)[1]}
    for p in precisions:
        out[f"p{precision_tag(p)}"] = ranking.recall_at_precision_from_state(fit, p)[1]
    return out


def threshold_protocol_from_states(
    fit: RetrievalState, evaluate: RetrievalState, precisions: tuple[float, ...] = (0.9,)
) -> dict[str, float]:
    """Protocol metrics: thresholds fitted on ``fit``, reported on ``evaluate``.

    ``evaluate`` must hold the fitted thresholds on its grid (build it with
    ``extra_grid`` = the finite values of ``fit_thresholds``), else the counts at a
    threshold would miss the negatives between it and the next positive.

    Returns ``f1g``, ``r@p{tag}`` per level, ``f1q``, ``threshold_f1``,
    ``threshold_p{tag}`` (NaN metrics when the eval half has no positive pair).
    """
    precisions = check_precisions(precisions)
    thresholds = fit_thresholds(fit, precisions)
    tp, fp, count = ranking.global_curve(evaluate)
    total = float(count.sum())
    grid = evaluate.grid.double().cpu()

    def at(threshold: Tensor) -> tuple[float, float]:
        if not bool(torch.isfinite(threshold)):
            return 0.0, 0.0  # no threshold reaches the precision: nothing is retrieved
        value = threshold.double().reshape(1)
        index = int(torch.searchsorted(grid, value).item())
        if index >= grid.numel() or float(grid[index]) != float(value):
            raise ValueError(
                "threshold protocol: the eval state does not hold the fitted threshold "
                f"{float(value)} on its grid (build it with extra_grid)"
            )
        return float(tp[index]), float(fp[index])

    nan = float("nan")
    tp_f1, fp_f1 = at(thresholds["f1"])
    out = {"f1g": 2 * tp_f1 / (tp_f1 + fp_f1 + total) if total else nan}
    for p in precisions:
        tag = precision_tag(p)
        tp_p, _ = at(thresholds[f"p{tag}"])
        out[f"r@p{tag}"] = tp_p / total if total else nan
    out["f1q"] = float(ranking.per_query_f1_from_state(evaluate))
    out["threshold_f1"] = float(thresholds["f1"])
    for p in precisions:
        tag = precision_tag(p)
        out[f"threshold_p{tag}"] = float(thresholds[f"p{tag}"])
    return out


def protocol_states(
    build: Callable[[int, Tensor | None], RetrievalState], precisions: tuple[float, ...]
) -> tuple[RetrievalState, RetrievalState]:
    """The (fit, eval) problems from a builder ``build(half, extra_grid)`` of each half's
    own problem (0 = fit, 1 = eval; ``extra_grid``: thresholds to count at exactly).
    Pass them to ``threshold_protocol_from_states``."""
    precisions = check_precisions(precisions)
    fit = build(0, None)
    fitted = [t.double().reshape(()) for t in fit_thresholds(fit, precisions).values()]
    thresholds = torch.stack(fitted)
    evaluate = build(1, thresholds[torch.isfinite(thresholds)])
    return fit, evaluate
