"""Engine with ``query_index`` (a query subset of the database, self pair excluded)
== functional metrics on the materialised matrix with the self pairs masked."""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.metrics import average_precision_score

from rl_gap.metrics.functional import (
    evaluate_embeddings,
    evaluate_scores,
    global_ap,
    global_f1,
    mean_ap,
    per_query_f1,
    recall_at_k,
    recall_at_precision,
)


def _dyadic(n: int, dim: int, seed: int) -> torch.Tensor:
    """float64 embeddings with exact dot products in any block shape, many exact ties."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, (n, dim), generator=g).double() / 4


def _subset_problem(num_d: int = 80, num_q: int = 30, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    database = _dyadic(num_d, 5, seed + 1)
    labels = torch.randint(0, 15, (num_d,), generator=g)
    query_index = torch.randperm(num_d, generator=g)[:num_q]
    scores = database[query_index] @ database.T
    rel = labels[query_index][:, None] == labels[None]
    valid = torch.ones(num_q, num_d, dtype=torch.bool)
    valid[torch.arange(num_q), query_index] = False
    return database, labels, query_index, scores, rel, valid


def _close(x: float, y) -> bool:
    y = float(y)
    return (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, abs=1e-12)


@pytest.mark.parametrize("cache_bytes", [0, 1000, 512 << 20])  # recomputed / some / all kept
@pytest.mark.parametrize("block", [(3, 7), 8, (16, 5), 4096])
def test_query_subset_equals_functional_metrics(block, cache_bytes):
    database, labels, query_index, scores, rel, valid = _subset_problem()
    # Self pairs are the top score of a query's row only sometimes: make sure
    # ties with the self score exist so that masking (not ordering) is tested.
    assert bool((scores == scores[torch.arange(30), query_index][:, None]).sum(1).gt(1).any())
    out = evaluate_embeddings(
        database[query_index], database, labels[query_index], labels,
        query_index=query_index, block_size=block, ks=(1, 5), map_at=(4,), ceiling=False,
        cache_bytes=cache_bytes,
    )  # fmt: skip
    assert _close(out["gap"], global_ap(scores, rel, valid))
    assert _close(out["map"], mean_ap(scores, rel, valid))
    assert _close(out["map@4"], mean_ap(scores, rel, valid, k=4))
    assert _close(out["r@1"], recall_at_k(scores, rel, valid, k=1))
    assert _close(out["r@5"], recall_at_k(scores, rel, valid, k=5))
    assert _close(out["r@p90"], recall_at_precision(scores, rel, valid, 0.9))
    assert _close(out["f1g"], global_f1(scores, rel, valid))
    assert _close(out["f1q"], per_query_f1(scores, rel, valid))
    # Self is neither positive nor negative.
    assert out["num_positive_pairs"] == float((rel & valid).sum())
    assert out["num_pairs"] == float(valid.sum())
    assert out["num_distractor_queries"] == float(((rel & valid).sum(1) == 0).sum())
    # Every key agrees with the dense suite on the same matrix.
    ref = evaluate_scores(scores, rel, valid, ks=(1, 5), map_at=(4,), ceiling=False)
    for key, value in ref.items():
        assert _close(out[key], value), key


def test_gap_brute_force_and_sklearn_on_valid_pairs():
    database, labels, query_index, scores, rel, valid = _subset_problem(60, 20, seed=3)
    out = evaluate_embeddings(
        database[query_index], database, labels[query_index], labels, query_index=query_index
    )
    # docs/definitions.md: prec(i) = |{p in P: s_p >= s_i}| / |{a: s_a >= s_i}| over the valid pairs.
    s, r = scores[valid], rel[valid]
    ap = sum(float((s[r] >= si).sum()) / float((s >= si).sum()) for si in s[r].tolist())
    assert out["gap"] == pytest.approx(ap / int(r.sum()), abs=1e-12)
    assert out["gap"] == pytest.approx(average_precision_score(r.numpy(), s.numpy()), abs=1e-12)
    # Without query_index the self pairs count as positives.
    with_self = evaluate_embeddings(
        database[query_index], database, labels[query_index], labels, block_size=7
    )
    assert with_self["num_positive_pairs"] == out["num_positive_pairs"] + 20
    assert with_self["gap"] != out["gap"]


@pytest.mark.parametrize("block", [5, (7, 3), 4096])
def test_identity_query_index_equals_exclude_self(block):
    x = _dyadic(50, 4, 11)
    labels = torch.arange(50) % 9
    a = evaluate_embeddings(x, x, labels, labels, exclude_self=True, block_size=block)
    b = evaluate_embeddings(x, x, labels, labels, query_index=torch.arange(50), block_size=block)
    assert a == b


def test_query_index_with_relevant_pairs():
    database, labels, query_index, scores, rel, valid = _subset_problem(40, 12, seed=5)
    pairs = rel.nonzero(as_tuple=True)  # includes the self pairs: they must be dropped
    out = evaluate_embeddings(
        database[query_index], database, relevant_pairs=pairs, query_index=query_index,
        block_size=(5, 6),
    )  # fmt: skip
    ref = evaluate_scores(scores, rel, valid)
    for key, value in ref.items():
        assert _close(out[key], value), key


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(query_index=torch.arange(3)), r"shape \(3,\), expected \(4,\)"),
        (dict(query_index=torch.arange(4).reshape(2, 2)), "shape"),
        (dict(query_index=torch.arange(4).double()), "integer"),
        (dict(query_index=torch.tensor([0, 1, 2, 6])), "out of range"),
        (dict(query_index=torch.tensor([0, -1, 2, 3])), "out of range"),
        (dict(query_index=torch.tensor([0, 1, 1, 3])), "duplicate"),
        (dict(query_index=torch.arange(4), exclude_self=True), "not both"),
        (dict(exclude_self=True), "query_index"),
        (dict(query_index=torch.arange(4), query_labels=torch.ones(4, dtype=torch.long)),
         "label"),
    ],
)  # fmt: skip
def test_query_index_bad_input(kwargs, message):
    args = dict(
        queries=torch.randn(4, 3),
        database=torch.randn(6, 3),
        query_labels=torch.zeros(4, dtype=torch.long),
        database_labels=torch.zeros(6, dtype=torch.long),
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        evaluate_embeddings(**args)
