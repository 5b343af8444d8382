"""Brute-force consistency ceiling: the exact best gAP over all interleavings (tests only).

A query's ranked list is a sequence of tie groups (distinct scores, best
first), each group ``(negatives, positives)``. An interleaving is any weak
order of all items whose restriction to each query is that query's ranking:
a sequence of global tie groups, each the union of the next tie group of some
set of queries. gAP counts a global group as gAP counts ties: its negatives
ahead of its positives, every positive credited with the precision at the
group's end. The maximum is found exactly by memoised search over (position
in every query's list) — every weak order is one path — in float64.
"""

from __future__ import annotations

from functools import cache
from itertools import combinations

import numpy as np
from sklearn.metrics import average_precision_score


def tie_groups(scores: np.ndarray, rel: np.ndarray, valid: np.ndarray) -> list[list[tuple]]:
    """Per query: [(negatives, positives)] of its tie groups, highest score first."""
    out = []
    for q in range(scores.shape[0]):
        s, r = scores[q][valid[q]], rel[q][valid[q]]
        groups = []
        for level in sorted(set(s.tolist()), reverse=True):
            at = s == level
            groups.append((int((at & ~r).sum()), int((at & r).sum())))
        out.append(groups)
    return out


def best_interleaving_ap(scores, rel, valid, merge_across_queries: bool = True) -> float:
    """max gAP over interleavings (``merge_across_queries=False``: no cross-query ties)."""
    chains = tie_groups(np.asarray(scores), np.asarray(rel, bool), np.asarray(valid, bool))
    total_pos = sum(p for c in chains for _, p in c)
    pos_left = [np.cumsum([p for _, p in c][::-1])[::-1].tolist() + [0] for c in chains]
    live = range(len(chains))

    @cache
    def best(state: tuple, hits: int, items: int) -> float:
        if all(pos_left[q][state[q]] == 0 for q in live):
            return 0.0
        ready = [q for q in live if state[q] < len(chains[q])]
        sizes = range(1, len(ready) + 1) if merge_across_queries else (1,)
        value = -1.0
        for size in sizes:
            for group in combinations(ready, size):
                neg = sum(chains[q][state[q]][0] for q in group)
                pos = sum(chains[q][state[q]][1] for q in group)
                nxt = list(state)
                for q in group:
                    nxt[q] += 1
                h, n = hits + pos, items + neg + pos
                gain = pos * h / n if pos else 0.0
                value = max(value, gain + best(tuple(nxt), h, n))
        return value

    return best(tuple(0 for _ in live), 0, 0) / total_pos


def observed_gap(scores, rel, valid) -> float:
    """gAP of the scores themselves (scikit-learn: a tied score is one threshold)."""
    valid = np.asarray(valid, bool)
    return float(average_precision_score(np.asarray(rel)[valid], np.asarray(scores)[valid]))


def random_instance(rng: np.random.Generator):
    """Small tie-heavy instance: 2-4 queries, 2-5 items each, scores on 1-4 levels."""
    q, d = int(rng.integers(2, 5)), int(rng.integers(2, 6))
    levels = int(rng.integers(1, 5))
    scores = rng.integers(0, levels, (q, d)).astype(np.float64) / max(levels - 1, 1)
    rel = rng.random((q, d)) < rng.uniform(0.2, 0.7)
    rel[int(rng.integers(q)), int(rng.integers(d))] = True
    valid = rng.random((q, d)) > 0.1
    valid |= rel
    return scores, rel, valid
