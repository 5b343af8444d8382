"""Bad metric inputs fail at once with a clear message, never give a silent wrong number.

Every value is checked against a brute-force reference (float64, ties pessimistic)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from rl_gap.metrics import (
    GlobalAP,
    MeanAP,
    RecallAtK,
    RecallAtPrecision,
    RetrievalMetrics,
    ThresholdProtocol,
)
from rl_gap.metrics.functional import evaluate_embeddings, mean_ap, recall_at_k


def _problem(seed: int = 0, n: int = 30):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (n, 4), generator=g).double() / 4
    labels = torch.randint(0, 6, (n,), generator=g)
    return x, labels


def _brute_recall_at_k(scores, rel, k):
    hits = []
    for s, r in zip(scores, rel):
        if r.any():
            hits.append(int((s[~r] >= s[r].max()).sum()) < k)
    return float(np.mean(hits))


def _brute_recall_at_precision(scores, rel, precision):
    s, r = scores.flatten().numpy(), rel.flatten().numpy()
    best = 0.0
    for t in np.unique(s[r]):
        tp, retrieved = np.sum(r & (s >= t)), np.sum(s >= t)
        if tp / retrieved >= precision:
            best = max(best, tp / r.sum())
    return best


def test_float_labels_refused_by_update_not_truncated():
    x, labels = _problem()
    metric = RetrievalMetrics()
    with pytest.raises(ValueError, match="non-integer"):
        metric.update(x, labels.double() + 0.5)
    # integer-valued floats are the same classes as the integers: sklearn reference
    metric.update(x, labels.double())
    scores = x @ x.T
    rel = (labels[:, None] == labels[None]).numpy()
    keep = ~np.eye(len(labels), dtype=bool)
    ref = average_precision_score(rel[keep], scores.numpy()[keep])
    assert float(metric.compute()["gap"]) == pytest.approx(ref, abs=1e-12)


def test_non_integer_k_refused_and_integer_k_exact():
    x, labels = _problem(1)
    scores, rel = x @ x.T, labels[:, None] == labels[None]
    with pytest.raises(ValueError, match="integer"):
        recall_at_k(scores, rel, k=1.5)
    with pytest.raises(ValueError, match="integer"):
        evaluate_embeddings(x, x, labels, labels, ks=(1.5,))
    # no self-exclusion here: rows hold their own item as a positive
    for k in (1, 2):
        assert float(recall_at_k(scores, rel, k=k)) == pytest.approx(
            _brute_recall_at_k(scores, rel, k), abs=1e-12
        )


def test_close_precision_levels_get_distinct_keys():
    x, labels = _problem(2)
    scores, rel = x @ x.T, labels[:, None] == labels[None]
    out = evaluate_embeddings(x, x, labels, labels, precisions=(0.5, 0.504), ceiling=False)
    assert out["r@p50"] == pytest.approx(_brute_recall_at_precision(scores, rel, 0.5), abs=1e-12)
    assert out["r@p50.4"] == pytest.approx(
        _brute_recall_at_precision(scores, rel, 0.504), abs=1e-12
    )
    with pytest.raises(ValueError, match="same metric key"):
        evaluate_embeddings(x, x, labels, labels, precisions=(0.9, 0.9000000001))
    metric = RecallAtPrecision(leave_one_out=False, precision=0.504)
    metric.update(x, labels, is_query=torch.arange(len(labels)) < 10)
    assert metric.key == "r@p50.4"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: RecallAtK(k=-1), "k must be >= 1"),
        (lambda: RecallAtK(k=1.5), "integer"),
        (lambda: MeanAP(k=0), "k must be >= 1"),
        (lambda: RecallAtPrecision(precision=1.5), r"\(0, 1\]"),
        (lambda: ThresholdProtocol(precision=0), r"\(0, 1\]"),
        (lambda: GlobalAP(block_size=0), "block_size"),
        (lambda: RetrievalMetrics(bootstrap=-5), "bootstrap"),
        (lambda: RetrievalMetrics(ks=(0,)), "ks entry must be >= 1"),
        (lambda: RetrievalMetrics(precisions=(0.9, 0.9)), "same metric key"),
    ],
)
def test_metric_constructor_arguments_checked_at_construction(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(bootstrap=-1), "bootstrap samples must be >= 0"),
        (dict(block_size=0), "block_size must be >= 1"),
        (dict(map_at=(2.5,)), "integer"),
        (dict(cache_bytes=-1), "cache_bytes"),
    ],
)
def test_evaluate_embeddings_bad_arguments(kwargs, message):
    x, labels = _problem(3)
    with pytest.raises(ValueError, match=message):
        evaluate_embeddings(x, x, labels, labels, exclude_self=True, **kwargs)


def test_positional_k_to_mean_ap_is_a_clear_error():
    x, labels = _problem(4)
    scores, rel = x @ x.T, labels[:, None] == labels[None]
    with pytest.raises(ValueError, match="keyword"):
        mean_ap(scores, rel, 5)


def test_empty_query_set_is_a_clear_error():
    x, labels = _problem(5)
    with pytest.raises(ValueError, match="empty"):
        evaluate_embeddings(x[:0], x, labels[:0], labels)
    metric = RetrievalMetrics()
    metric.update(x[:0], labels[:0])
    with pytest.raises(ValueError, match="no query embeddings"):
        metric.compute()


@pytest.mark.parametrize(
    "option, value",
    [("--n-boot", "-1"), ("--nested-boot", "-1"), ("--block-size", "0"), ("--gallery-size", "0")],
)
def test_extrapolate_options_checked_before_any_file_is_read(option, value):
    from rl_gap.cli import main

    argv = ["extrapolate", "--queries", "missing_q.npy", "--positives", "missing_p.npy",
            "--distractors", "missing_d.npy", "--gallery-size", "100", option, value]  # fmt: skip
    with pytest.raises(ValueError, match=f"{option} must be >="):
        main(argv)
