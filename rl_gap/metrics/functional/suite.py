"""One call, every metric: ``evaluate_embeddings`` (docs/definitions.md) and ``metrics_from_state``."""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from rl_gap.metrics.functional import ranking
from rl_gap.metrics.functional.arguments import (
    check_count,
    check_ks,
    check_precisions,
    precision_tag,
)
from rl_gap.metrics.functional.bootstrap import bootstrap_from_state
from rl_gap.metrics.functional.ceiling import ceiling_from_state
from rl_gap.metrics.functional.dense import state_from_scores
from rl_gap.metrics.functional.engine import (
    as_tensor,
    state_from_embeddings,
)
from rl_gap.metrics.functional.protocol import threshold_protocol_from_states
from rl_gap.metrics.functional.protocol_problems import (
    embedding_protocol_states,
    score_protocol_states,
)
from rl_gap.metrics.functional.score_norm import ScoreNorm, background_offsets
from rl_gap.metrics.functional.sharding import Shard
from rl_gap.metrics.functional.state import RetrievalState, torch_threads
from rl_gap.metrics.functional.suite_inputs import (
    check_options,
    checked_embeddings,
    positives_per_query,
    relevance,
)

__all__ = [
    "evaluate_embeddings",
    "evaluate_scores",
    "metrics_from_state",
    "query_groups",
    "embedding_protocol_states",
    "score_protocol_states",
    "check_suite_arguments",
]

log = logging.getLogger(__name__)

# Query groups: bit 0 = distractor query (no positive).
_DISTRACTOR = 1


def query_groups(has_positive: Tensor) -> tuple[Tensor, int]:
    """Group id per query (1 = distractor query, no positive) and the number of groups."""
    return (~has_positive.cpu()).long() * _DISTRACTOR, 2


def check_suite_arguments(
    ks=(1, 5, 10), precisions=(0.9,), map_at=(), bootstrap: int = 0
) -> tuple[tuple[int, ...], tuple[float, ...], tuple[int, ...], int]:
    """Validated ``(ks, precisions, map_at, bootstrap)`` (``arguments.py``)."""
    return (
        check_ks(ks, "ks"),
        check_precisions(precisions),
        check_ks(map_at, "map_at"),
        check_count(bootstrap, "bootstrap samples"),
    )


def metrics_from_state(
    state: RetrievalState,
    ks: tuple[int, ...] = (1, 5, 10),
    precisions: tuple[float, ...] = (0.9,),
    map_at: tuple[int, ...] = (),
    ceiling: bool | None = None,
    protocol: tuple[RetrievalState, RetrievalState] | None = None,
    bootstrap: int = 0,
    seed: int = 0,
    recall_state: RetrievalState | None = None,
) -> dict[str, float]:
    """Every metric from one state, as Python floats.

    Keys: ``gap``, ``gap_no_distractors``, ``map``, ``map@k``, ``map@r`` and
    ``r_precision`` (pytorch-metric-learning's MAP@R / R-precision), ``r@k``,
    ``r@p{90}`` (+ ``threshold_p90``; 0.904 gives ``r@p90.4``), ``f1g``/``f1q`` (best
    global / mean per-query F1 on all queries), ``ceiling``/``efficiency`` (when
    computed; ``ceiling=None`` computes it up to 2e6 positive pairs), ``protocol_*``
    (threshold protocol from ``protocol`` = the (fit, eval) half problems of
    ``protocol_states``), ``gap_ci_*``/``map_ci_*`` (bootstrap), and counts
    ``num_queries``, ``num_positive_pairs``, ``num_pairs``,
    ``num_distractor_queries``, ``num_recall_queries`` (queries R@k averages over).
    ``recall_state``: R@k from this problem instead (iNaturalist: gAP/mAP on 4 queries
    per class, R@k over every test image). Groups follow ``query_groups``.
    """
    with torch_threads(1):  # small ops: one CPU thread (see ``torch_threads``)
        return _metrics(
            state, ks, precisions, map_at, ceiling, protocol, bootstrap, seed, recall_state
        )


def _metrics(state, ks, precisions, map_at, ceiling, protocol, bootstrap, seed, recall_state):
    ks, precisions, map_at, bootstrap = check_suite_arguments(ks, precisions, map_at, bootstrap)
    if isinstance(protocol, bool):
        raise ValueError(
            "protocol takes the (fit, eval) half problems (protocol_states / "
            "embedding_protocol_states), not a bool"
        )
    out: dict[str, float] = {}
    num_pos = state.num_positives
    out["gap"] = float(ranking.global_ap_from_state(state))
    num_groups = state.grid_neg_ge.shape[0]
    with_positive = [g for g in range(num_groups) if not g & _DISTRACTOR]
    if num_groups > 1:
        out["gap_no_distractors"] = float(ranking.global_ap_from_state(state, with_positive))
    else:
        out["gap_no_distractors"] = out["gap"]
    out["map"] = float(ranking.mean_ap_from_state(state))
    for k in map_at:
        out[f"map@{k}"] = float(ranking.mean_ap_from_state(state, k))
    out["map@r"] = float(ranking.map_at_r_from_state(state))
    out["r_precision"] = float(ranking.r_precision_from_state(state))
    recall_from = state if recall_state is None else recall_state
    for k in ks:
        out[f"r@{k}"] = float(ranking.recall_at_k_from_state(recall_from, k))
    for p in precisions:
        recall, threshold = ranking.recall_at_precision_from_state(state, p)
        out[f"r@p{precision_tag(p)}"] = float(recall)
        out[f"threshold_p{precision_tag(p)}"] = float(threshold)
    out["f1g"] = float(ranking.global_f1_from_state(state)[0])
    out["f1q"] = float(ranking.per_query_f1_from_state(state))
    num_pairs = int(state.num_negatives.sum()) + int(num_pos.sum())
    if ceiling is None:
        ceiling = int(num_pos.sum()) <= 2_000_000
    if ceiling and int(num_pos.sum()) > 0:
        c = ceiling_from_state(state)
        out.update(c)
        out["efficiency"] = out["gap"] / c["ceiling"] if c["ceiling"] > 0 else float("nan")
    if protocol is not None:
        result = threshold_protocol_from_states(protocol[0], protocol[1], precisions)
        out.update({f"protocol_{k}": v for k, v in result.items()})
    if bootstrap > 0:
        out.update(bootstrap_from_state(state, bootstrap, seed=seed))
    out["num_queries"] = float(state.num_queries)
    out["num_positive_pairs"] = float(num_pos.sum())
    out["num_pairs"] = float(num_pairs)
    out["num_distractor_queries"] = float((num_pos == 0).sum())
    out["num_recall_queries"] = float((recall_from.num_positives > 0).sum())
    return out


def evaluate_embeddings(
    queries,
    database=None,
    query_labels=None,
    database_labels=None,
    exclude_self: bool = False,
    *,
    query_index: Tensor | None = None,
    relevant_pairs: tuple[Tensor, Tensor] | None = None,
    relevance_fn=None,
    ks: tuple[int, ...] = (1, 5, 10),
    precisions: tuple[float, ...] = (0.9,),
    map_at: tuple[int, ...] = (),
    ceiling: bool | None = None,
    protocol: bool = False,
    bootstrap: int = 0,
    bootstrap_budget: int = 1 << 24,
    block_size: int | tuple[int, int] = 2048,
    device: torch.device | str | None = None,
    seed: int = 0,
    cache_bytes: int = 512 << 20,
    background=None,
    score_norm: ScoreNorm | None = None,
    shard: Shard | None = None,
    recall_over_database: bool = False,
    protocol_failure: str = "raise",
    return_state: bool = False,
    normalize: bool = False,
):
    """Exact retrieval metrics from embeddings, never building the Q x D matrix.

    Scores are dot products (``normalize``: cosine, rows L2-normalised as blocks are
    read). Relevance: same label, ``relevant_pairs = (query_idx, database_idx)`` or
    ``relevance_fn(query_idx, database_idx) -> bool block``. ``exclude_self`` (queries
    are the database) or ``query_index`` (query i is database row ``query_index[i]``)
    drops self pairs. Distractor queries (no positive) count in gAP only.
    ``protocol``: threshold protocol (``protocol.py``; ``protocol_failure="nan"``: NaN
    and a warning when it cannot be built); ``bootstrap=n``: 95% intervals;
    ``cache_bytes``: positive blocks kept between the engine's passes; ``background``
    ((B, dim)): rank ``q . d - beta * mean top background score`` (``score_norm.py``);
    ``shard``: processes split the blocks (``sharding.py``); ``recall_over_database``:
    R@k over every database item, leave-one-out. Keys: ``metrics_from_state``; engine:
    ``state_from_embeddings``. Returns floats (``return_state``: and the state).

    Example (leave-one-out; items 1 and 3 rank a 0.96 negative above their 0.8
    positive, mAP = 3/4, R@1 = 1/2; the four positives tie after two negatives, gAP = 4/6):

        >>> import torch
        >>> from rl_gap.metrics.functional import evaluate_embeddings
        >>> emb = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]])
        >>> out = evaluate_embeddings(emb, query_labels=torch.tensor([0, 0, 1, 1]),
        ...                           exclude_self=True)
        >>> {key: round(out[key], 4) for key in ("gap", "map", "r@1", "num_positive_pairs")}
        {'gap': 0.6667, 'map': 0.75, 'r@1': 0.5, 'num_positive_pairs': 4.0}
    """
    ks, precisions, map_at, bootstrap = check_suite_arguments(ks, precisions, map_at, bootstrap)
    check_options(
        protocol_failure, recall_over_database, relevant_pairs, relevance_fn, protocol,
        background, score_norm, normalize,
    )  # fmt: skip
    queries_t, database, self_index = checked_embeddings(
        queries, database, query_index, exclude_self
    )
    engine = {
        "block_size": block_size, "device": device, "cache_bytes": cache_bytes, "shard": shard,
        "normalize": normalize,
    }  # fmt: skip
    offsets, database, query_index, exclude_self = _score_offsets(
        queries_t, database, background, score_norm, engine, query_index, exclude_self, self_index
    )
    relevant_pairs, has_positive, q_lab, d_lab = relevance(
        relevant_pairs, relevance_fn, query_labels, database_labels, queries_t, database,
        self_index,
    )  # fmt: skip
    group, num_groups = query_groups(has_positive)
    state = state_from_embeddings(
        queries_t, database, query_labels, database_labels, exclude_self=exclude_self,
        query_index=query_index, relevant_pairs=relevant_pairs, query_group=group,
        num_groups=num_groups, bootstrap_budget=bootstrap_budget if bootstrap > 0 else 0,
        validated=True, query_offsets=offsets, **engine,
    )  # fmt: skip
    items = queries_t if database is None else database
    recall_state = (
        _leave_one_out_state(items, d_lab, engine) if recall_over_database and ks else None
    )
    halves = None
    if protocol:
        halves = _protocol_or_none(
            protocol_failure, queries_t, database, q_lab, d_lab, exclude_self=exclude_self,
            query_index=query_index, precisions=precisions, seed=seed, query_offsets=offsets,
            **engine,
        )  # fmt: skip
    metrics = metrics_from_state(
        state, ks, precisions, map_at, ceiling, halves, bootstrap, seed, recall_state
    )
    if protocol and halves is None:
        metrics.update(_missing_protocol(precisions))
    return (metrics, state) if return_state else metrics


def _score_offsets(
    queries, database, background, score_norm, engine, query_index, exclude_self, self_index
):
    """``(offsets, database, query_index, exclude_self)``: per-query offsets against the
    ``background`` (None without one); shifted scores are not symmetric, so
    leave-one-out becomes self pairs by index."""
    if background is None:
        return None, database, query_index, exclude_self
    block_size, device = engine["block_size"], engine["device"]
    offsets = _background_offsets(queries, background, score_norm, block_size, device)
    if exclude_self:
        return offsets, queries if database is None else database, self_index, False
    return offsets, database, query_index, exclude_self


def _background_offsets(queries: Tensor, background, score_norm, block_size, device) -> Tensor:
    """Per-query score offsets against ``background`` (``score_norm.py``). The engine
    subtracts them from its score blocks, so the database is still read block-wise."""
    return background_offsets(
        queries,
        as_tensor(background, "background"),
        score_norm or ScoreNorm(),
        block_size=block_size if isinstance(block_size, int) else block_size[1],
        device=device,
    )


def _leave_one_out_state(items: Tensor, labels: Tensor, engine: dict) -> RetrievalState:
    """Every item a query against all others (R@k over the whole database)."""
    group, num_groups = query_groups(positives_per_query(labels, labels, True) > 0)
    return state_from_embeddings(
        items, items, labels, labels, exclude_self=True, query_group=group,
        num_groups=num_groups, validated=True, **engine,
    )  # fmt: skip


def _protocol_or_none(failure: str, *args, **kwargs):
    """``embedding_protocol_states``; with ``failure="nan"`` a protocol that cannot be
    built (e.g. one class) logs a warning and gives None."""
    try:
        return embedding_protocol_states(*args, **kwargs)
    except ValueError as error:
        if failure == "raise":
            raise
        log.warning("threshold protocol not computed (protocol_* = NaN): %s", error)
        return None


def _missing_protocol(precisions: tuple[float, ...]) -> dict[str, float]:
    """NaN for every ``protocol_*`` key (a protocol that could not be built)."""
    keys = ["f1g", "f1q", "threshold_f1"]
    keys += [f"{k}{precision_tag(p)}" for p in precisions for k in ("r@p", "threshold_p")]
    return {f"protocol_{k}": float("nan") for k in keys}


def evaluate_scores(
    scores: Tensor,
    rel: Tensor,
    valid: Tensor | None = None,
    *,
    query_labels: Tensor | None = None,
    database_labels: Tensor | None = None,
    ks: tuple[int, ...] = (1, 5, 10),
    precisions: tuple[float, ...] = (0.9,),
    map_at: tuple[int, ...] = (),
    ceiling: bool | None = None,
    bootstrap: int = 0,
    seed: int = 0,
) -> dict[str, float]:
    """``evaluate_embeddings`` for a materialised ``(scores, rel, valid)`` matrix.

    ``query_labels`` (Q,) and ``database_labels`` (D,) (the class of each row and
    column) enable the threshold protocol: each half of the classes is its own
    problem, ``scores[q_half][:, d_half]`` (``protocol.py``).
    """
    if not isinstance(rel, Tensor) or not isinstance(scores, Tensor):
        raise ValueError("scores and rel must be torch tensors")
    ks, precisions, map_at, bootstrap = check_suite_arguments(ks, precisions, map_at, bootstrap)
    has_positive = (
        (rel.bool() & (valid if valid is not None else True)).reshape(-1, rel.shape[-1])
    ).any(1)
    group, num_groups = query_groups(has_positive)
    state = state_from_scores(
        scores, rel, valid, group.to(scores.device), num_groups, (1 << 24) if bootstrap else 0
    )
    halves = None
    if query_labels is not None or database_labels is not None:
        halves = score_protocol_states(
            scores, rel, valid, query_labels, database_labels, precisions, seed
        )
    return metrics_from_state(state, ks, precisions, map_at, ceiling, halves, bootstrap, seed)
