"""Metrics of a distractor-query task: queries against a separate database.

Evaluation sets of ``rl_gap.data.distractor_sets`` hold queries, database items
and (optionally) background items in one embedded split, told apart by a
*role* per item. Relevance is "same label" between a query and a database item;
a query whose label no database item has is a *distractor query*:

- ``gap``: global AP with the distractor queries' pairs as negatives;
- ``gap_no_distractors``: global AP with the distractor queries removed;
- ``map``, ``map@k``, ``r@k``, ``f1q``: over the queries with a match only;
- ``num_distractor_queries``: their count;
- ``norm_*``: the same after query-side score normalisation against the
  background items (``rl_gap.metrics.functional.score_norm``), when given.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl_gap.metrics.functional.engine import state_from_embeddings
from rl_gap.metrics.functional.score_norm import ScoreNorm, background_offsets, offset_embeddings
from rl_gap.metrics.functional.state import RetrievalState
from rl_gap.metrics.functional.suite import check_suite_arguments, metrics_from_state, query_groups

ROLE_QUERY, ROLE_DATABASE, ROLE_BACKGROUND = 0, 1, 2

__all__ = ["ROLE_QUERY", "ROLE_DATABASE", "ROLE_BACKGROUND", "distractor_metrics"]


def distractor_metrics(
    embeddings: Tensor,
    labels: Tensor,
    roles: Tensor,
    *,
    ks: tuple[int, ...] = (1, 5, 10),
    precisions: tuple[float, ...] = (0.9,),
    map_at: tuple[int, ...] = (),
    score_norm: ScoreNorm | None = None,
    block_size: int = 2048,
) -> tuple[dict[str, float], RetrievalState]:
    """Exact metrics of queries against the database, with and without distractor queries.

    Args:
        embeddings: (N, dim) embeddings of every item of the split.
        labels: (N,) integer labels (query label = the label of its matches).
        roles: (N,) ``ROLE_QUERY`` / ``ROLE_DATABASE`` / ``ROLE_BACKGROUND``.
        ks / precisions / map_at: cut-offs of R@k, R@P and mAP@k.
        score_norm: also report ``norm_*`` metrics after query-side normalisation
            against the background items (None: no normalisation).
        block_size: GEMM block of the engine.

    Returns:
        (metrics, raw retrieval state). Keys as ``metrics_from_state`` plus ``norm_*``.
    """
    ks, precisions, map_at, _ = check_suite_arguments(ks, precisions, map_at)
    if embeddings.ndim != 2 or labels.shape != (embeddings.shape[0],):
        raise ValueError(
            f"embeddings must be (N, dim) with labels (N,), got {tuple(embeddings.shape)} and "
            f"{tuple(labels.shape)}"
        )
    if roles.shape != labels.shape:
        raise ValueError(f"roles must be ({labels.shape[0]},), got {tuple(roles.shape)}")
    roles = roles.to(embeddings.device)
    unknown = ~torch.isin(roles, torch.tensor([0, 1, 2], device=roles.device))
    if bool(unknown.any()):
        raise ValueError(
            f"unknown role {int(roles[unknown][0])}: roles are 0 query, 1 database, 2 background"
        )
    is_q, is_d, is_b = roles == ROLE_QUERY, roles == ROLE_DATABASE, roles == ROLE_BACKGROUND
    if not bool(is_q.any()) or not bool(is_d.any()):
        raise ValueError(
            f"a distractor-query evaluation needs queries and database items, got "
            f"{int(is_q.sum())} queries and {int(is_d.sum())} database items"
        )
    queries, database = embeddings[is_q], embeddings[is_d]
    q_lab, d_lab = labels[is_q].long(), labels[is_d].long()
    has_positive = torch.isin(q_lab, d_lab).cpu()
    if not bool(has_positive.any()):
        raise ValueError("no query has a match in the database: gAP and mAP are undefined")
    group, num_groups = query_groups(has_positive)

    def metrics(q: Tensor, d: Tensor) -> tuple[dict[str, float], RetrievalState]:
        # the engine scores in float32 with autocast off (rl_gap/precision.py)
        state = state_from_embeddings(
            q, d, q_lab, d_lab, query_group=group, num_groups=num_groups, block_size=block_size
        )
        return metrics_from_state(state, ks, precisions, map_at, ceiling=False), state

    out, state = metrics(queries, database)
    if score_norm is not None:
        if not bool(is_b.any()):
            raise ValueError("score normalisation needs background items (role 2), got none")
        offsets = background_offsets(queries, embeddings[is_b], score_norm)
        normed, _ = metrics(*offset_embeddings(queries, database, offsets))
        out.update({f"norm_{k}": v for k, v in normed.items() if not k.startswith("num_")})
    return out, state
