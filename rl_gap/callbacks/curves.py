"""Curves behind the gSAP paper's consistency plots, read off the exact retrieval state.

- :func:`global_pr_curve`: the precision-recall curve of all pairs ranked in
  one list (gAP is the area under its steps);
- :func:`per_query_best_thresholds`: every query's F1-optimal threshold, whose
  spread around the shared (global-F1) threshold is the paper's Figure 4.

Pure tensor functions of :class:`rl_gap.metrics.functional.RetrievalState`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl_gap.metrics.functional import ranking
from rl_gap.metrics.functional.state import RetrievalState


def global_pr_curve(state: RetrievalState) -> tuple[Tensor, Tensor, Tensor]:
    """Global precision and recall at each distinct positive score, thresholds descending.

    Returns ``(precision, recall, thresholds)``, each (G,) float64, where at
    threshold ``t``: precision = |P ∩ {s ≥ t}| / |{s ≥ t}| and recall =
    |P ∩ {s ≥ t}| / |P| over all valid pairs (ties counted pessimistically).
    """
    tp, fp, count = ranking.global_curve(state)
    total = count.sum()
    precision = tp / (tp + fp).clamp_min(1)
    recall = tp / total.clamp_min(1)
    thresholds = state.grid.double().cpu()
    return precision.flip(0).cpu(), recall.flip(0).cpu(), thresholds.flip(0)


def per_query_best_thresholds(state: RetrievalState) -> tuple[Tensor, Tensor]:
    """Each query's F1-maximising threshold (a positive score) and that best F1.

    Query q's F1 at its positive i (all items scoring ≥ s_i retrieved) is
    ``2 pos_ge / (pos_ge + neg_ge + |P_q|)``; the best over i is the query's F1
    (the quantity averaged by F1q). Among equally good thresholds the highest
    is returned. Queries without positives are skipped.

    Returns:
        thresholds: (Q',) float64 for the Q' queries with ≥1 positive (query order).
        best_f1: (Q',) float64.
    """
    num_q = state.num_queries
    pos_ge = state.pos_pos_ge.double()
    num_pos = state.num_positives
    f1 = 2 * pos_ge / (pos_ge + state.pos_neg_ge.double() + num_pos[state.pos_query].double())
    best = torch.full((num_q,), -1.0, dtype=torch.float64, device=f1.device)
    best.scatter_reduce_(0, state.pos_query, f1, reduce="amax")
    is_best = f1 == best[state.pos_query]
    scores = torch.where(is_best, state.pos_scores.double(), torch.full_like(f1, -torch.inf))
    threshold = torch.full((num_q,), -torch.inf, dtype=torch.float64, device=f1.device)
    threshold.scatter_reduce_(0, state.pos_query, scores, reduce="amax")
    has_pos = num_pos > 0
    return threshold[has_pos].cpu(), best[has_pos].cpu()
