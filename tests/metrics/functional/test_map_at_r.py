"""MAP@R and R-precision against a float64 brute force and pytorch-metric-learning.

The brute force sorts each row (score descending, a tie group's negatives first:
the documented tie rule), cuts it at R and applies the definitions directly;
``AccuracyCalculator`` is the field's reference implementation (compared on
tie-free scores, where its arbitrary tie order cannot matter).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rl_gap.metrics.functional import (
    evaluate_embeddings,
    evaluate_scores,
    map_at_r,
    r_precision,
)


def brute_force(scores, rel, valid=None) -> tuple[float, float, int]:
    """(MAP@R, R-precision, queries skipped for R = 0), float64, one row at a time."""
    scores = np.asarray(scores, dtype=np.float64)
    rel = np.asarray(rel, dtype=bool)
    valid = np.ones_like(rel) if valid is None else np.asarray(valid, dtype=bool)
    maps, rps, skipped = [], [], 0
    for s, r, v in zip(scores, rel, valid):
        s, r = s[v], r[v]
        big_r = int(r.sum())
        if big_r == 0:
            skipped += 1
            continue
        order = np.lexsort((r, -s))  # score descending; within a tie, False (negatives) first
        top = r[order][:big_r]
        hits = np.cumsum(top)
        precision_at_i = hits / np.arange(1, big_r + 1)
        maps.append(float((precision_at_i * top).sum() / big_r))
        rps.append(float(top.sum() / big_r))
    nan = float("nan")
    return (np.mean(maps) if maps else nan), (np.mean(rps) if rps else nan), skipped


def test_hand_computed_ranking_with_ties():
    # row 0: 0.9+ 0.8- 0.7+ 0.1-        R = 2: top 2 = +,-  -> MAP@R 1/2, R-prec 1/2
    # row 1: 0.5- 0.5+ 0.5+ 0.2+        R = 3: tie of 3 with its negative first:
    #        order -,+,+ | +  -> P(2) = 1/2, P(3) = 2/3: MAP@R (1/2+2/3)/3 = 7/18, R-prec 2/3
    # row 2: no positive: skipped
    scores = torch.tensor(
        [[0.9, 0.8, 0.7, 0.1], [0.5, 0.5, 0.5, 0.2], [0.3, 0.2, 0.1, 0.0]], dtype=torch.float64
    )
    rel = torch.tensor([[1, 0, 1, 0], [0, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    assert float(map_at_r(scores, rel)) == pytest.approx((0.5 + 7 / 18) / 2, abs=1e-15)
    assert float(r_precision(scores, rel)) == pytest.approx((0.5 + 2 / 3) / 2, abs=1e-15)
    out = evaluate_scores(scores, rel)
    assert out["map@r"] == pytest.approx((0.5 + 7 / 18) / 2, abs=1e-15)
    assert out["num_distractor_queries"] == 1.0


@pytest.mark.parametrize("seed", range(6))
def test_materialised_scores_equal_brute_force_with_ties_and_empty_rows(seed):
    g = torch.Generator().manual_seed(seed)
    q, d = 17, 23
    scores = torch.randint(0, 5, (q, d), generator=g).double() / 4  # heavy ties
    rel = torch.rand(q, d, generator=g) < 0.25
    rel[:3] = False  # queries without positives
    valid = torch.rand(q, d, generator=g) > 0.1
    want_map, want_rp, skipped = brute_force(scores, rel, valid)
    assert skipped >= 3
    assert float(map_at_r(scores, rel, valid)) == pytest.approx(want_map, abs=1e-12)
    assert float(r_precision(scores, rel, valid)) == pytest.approx(want_rp, abs=1e-12)
    out = evaluate_scores(scores, rel, valid)
    assert out["map@r"] == pytest.approx(want_map, abs=1e-12)
    assert out["r_precision"] == pytest.approx(want_rp, abs=1e-12)
    assert out["num_distractor_queries"] == skipped


def _integer_embeddings(n: int, dim: int, seed: int) -> torch.Tensor:
    """Small-integer embeddings: dot products exact in any block shape, many ties."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, (n, dim), generator=g).float()


@pytest.mark.parametrize("cache_bytes", [0, 1500, 512 << 20])
@pytest.mark.parametrize("seed", range(3))
def test_engine_leave_one_out_equals_brute_force(seed, cache_bytes):
    x = _integer_embeddings(40, 3, seed)
    labels = torch.randint(0, 9, (40,), generator=torch.Generator().manual_seed(seed + 7))
    labels[0] = 100  # a singleton class: a query without positives
    scores = (x.double() @ x.double().T).numpy()
    rel = (labels[:, None] == labels[None, :]).numpy()
    valid = ~np.eye(40, dtype=bool)
    want_map, want_rp, skipped = brute_force(scores, rel, valid)
    out = evaluate_embeddings(
        x, query_labels=labels, exclude_self=True, block_size=16, cache_bytes=cache_bytes,
        ceiling=False,
    )  # fmt: skip
    assert skipped >= 1 and out["num_distractor_queries"] == skipped
    assert out["map@r"] == pytest.approx(want_map, abs=1e-12)
    assert out["r_precision"] == pytest.approx(want_rp, abs=1e-12)


def test_engine_separate_database_equals_brute_force():
    queries = _integer_embeddings(25, 4, 11)
    database = _integer_embeddings(60, 4, 12)
    g = torch.Generator().manual_seed(13)
    q_lab = torch.randint(0, 6, (25,), generator=g)
    d_lab = torch.randint(0, 5, (60,), generator=g)  # class 5 queries: no positives
    q_lab[:2] = 5
    scores = (queries.double() @ database.double().T).numpy()
    rel = (q_lab[:, None] == d_lab[None, :]).numpy()
    want_map, want_rp, skipped = brute_force(scores, rel)
    out = evaluate_embeddings(queries, database, q_lab, d_lab, block_size=8, ceiling=False)
    assert skipped >= 2
    assert out["map@r"] == pytest.approx(want_map, abs=1e-12)
    assert out["r_precision"] == pytest.approx(want_rp, abs=1e-12)


def test_bounds_and_perfect_ranking():
    # a perfect ranking gives 1; MAP@R <= R-precision on any ranking (P(i) <= 1)
    x = torch.eye(4).repeat_interleave(3, 0) + 0.01 * torch.randn(12, 4)
    labels = torch.arange(4).repeat_interleave(3)
    out = evaluate_embeddings(x, query_labels=labels, exclude_self=True, ceiling=False)
    assert out["map@r"] == 1.0 and out["r_precision"] == 1.0
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(30, 40, generator=g, dtype=torch.float64)
    rel = torch.rand(30, 40, generator=g) < 0.3
    assert float(map_at_r(scores, rel)) <= float(r_precision(scores, rel)) < 1.0


def test_no_positive_anywhere_is_nan():
    scores = torch.rand(3, 4, dtype=torch.float64)
    rel = torch.zeros(3, 4, dtype=torch.bool)
    assert math.isnan(float(map_at_r(scores, rel)))
    assert math.isnan(float(r_precision(scores, rel)))


# ---------------------------------------------------- pytorch-metric-learning
def _accuracy_calculator():
    accuracy = pytest.importorskip("pytorch_metric_learning.utils.accuracy_calculator")
    inference = pytest.importorskip("pytorch_metric_learning.utils.inference")
    distances = pytest.importorskip("pytorch_metric_learning.distances")
    return accuracy.AccuracyCalculator(
        include=("mean_average_precision_at_r", "r_precision"),
        k="max_bin_count",
        knn_func=inference.CustomKNN(distances.DotProductSimilarity(normalize_embeddings=False)),
    )


@pytest.mark.parametrize("seed", range(3))
def test_leave_one_out_equals_pytorch_metric_learning(seed):
    calculator = _accuracy_calculator()
    g = torch.Generator().manual_seed(seed)
    # unit rows: each query is its own nearest item, which PML drops as "itself"
    x = torch.nn.functional.normalize(torch.randn(120, 16, generator=g, dtype=torch.float64))
    labels = torch.randint(0, 12, (120,), generator=g)
    labels[:3] = torch.tensor([50, 51, 52])  # lone queries (no positive): skipped by both
    want = calculator.get_accuracy(x, labels, x, labels, ref_includes_query=True)
    out = evaluate_embeddings(x, query_labels=labels, exclude_self=True, ceiling=False)
    assert out["map@r"] == pytest.approx(want["mean_average_precision_at_r"], abs=1e-12)
    assert out["r_precision"] == pytest.approx(want["r_precision"], abs=1e-12)


def test_separate_sets_equal_pytorch_metric_learning():
    calculator = _accuracy_calculator()
    g = torch.Generator().manual_seed(5)
    queries = torch.randn(50, 8, generator=g, dtype=torch.float64)
    database = torch.randn(200, 8, generator=g, dtype=torch.float64)
    q_lab = torch.randint(0, 10, (50,), generator=g)
    d_lab = torch.randint(0, 10, (200,), generator=g)
    want = calculator.get_accuracy(queries, q_lab, database, d_lab, ref_includes_query=False)
    out = evaluate_embeddings(queries, database, q_lab, d_lab, ceiling=False)
    assert out["map@r"] == pytest.approx(want["mean_average_precision_at_r"], abs=1e-12)
    assert out["r_precision"] == pytest.approx(want["r_precision"], abs=1e-12)
