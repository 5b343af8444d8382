"""Retrieval metrics, kNN and zero-shot accuracy on (fake) CUDA inputs equal the CPU values."""

from __future__ import annotations

import math

import pytest
import torch

from rl_gap.metrics import GlobalAP, MeanAP, RetrievalMetrics
from rl_gap.metrics.functional import evaluate_embeddings
from rl_gap.metrics.zero_shot import zero_shot_accuracy


def embeddings(n: int = 40, d: int = 8, classes: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    centers = torch.randn(classes, d, generator=g)
    x = torch.nn.functional.normalize(centers[labels] + torch.randn(n, d, generator=g), dim=1)
    return x, labels


def same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        x, y = float(a[key]), float(b[key])
        assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, abs=1e-12), key


SETUPS = {
    "leave_one_out": lambda x, y: ((x, x, y, y), {"exclude_self": True}),
    "separate_sets": lambda x, y: ((x[:15], x[15:], y[:15], y[15:]), {}),
    # queries of classes the database lacks: distractor queries
    "distractor_queries": lambda x, y: ((x[:15], x[15:], y[:15] + 4, y[15:]), {}),
    # no query has a positive at all: NaN metrics, not a crash
    "no_positive_pair": lambda x, y: (
        (x, x, torch.arange(len(y)), torch.arange(len(y))),
        {"exclude_self": True},
    ),
}


@pytest.mark.parametrize("setup", list(SETUPS))
def test_evaluate_embeddings_on_cuda_equals_cpu(fake_cuda, setup):
    x, y = embeddings()
    args, kwargs = SETUPS[setup](x, y)
    kwargs |= {"block_size": 16, "protocol": setup != "no_positive_pair", "map_at": (5,)}
    ref = evaluate_embeddings(*args, **kwargs)
    moved = {id(a): a.to("cuda") for a in args}  # one device copy of x passed twice
    out = evaluate_embeddings(*(moved[id(a)] for a in args), **kwargs)
    same(out, ref)
    out_dev = evaluate_embeddings(*args, device="cuda", **kwargs)
    same(out_dev, ref)
    if setup == "no_positive_pair":
        assert math.isnan(ref["gap"]) and ref["num_positive_pairs"] == 0
    else:
        assert 0 < ref["gap"] < 1


@pytest.mark.parametrize("leave_one_out", [True, False])
def test_retrieval_metrics_on_cuda_equals_cpu(fake_cuda, leave_one_out):
    x, y = embeddings()
    results = []
    for device in ("cpu", "cuda"):
        metric = RetrievalMetrics(leave_one_out=leave_one_out, map_at=(5,), block_size=16)
        metric = metric.to(device)
        for start in range(0, 40, 10):
            kwargs = {} if leave_one_out else {"is_query": torch.arange(start, start + 10) % 3 == 0}
            kwargs = {k: v.to(device) for k, v in kwargs.items()}
            metric.update(
                x[start : start + 10].to(device), y[start : start + 10].to(device), **kwargs
            )
        results.append(metric.compute())
    same(results[1], results[0])
    for cls in (GlobalAP, MeanAP):
        m = cls().to("cuda")
        m.update(x.to("cuda"), y.to("cuda"))
        c = cls()
        c.update(x, y)
        assert float(m.compute()) == pytest.approx(float(c.compute()), abs=1e-12)


def test_zero_shot_accuracy_on_cuda_under_deterministic(fake_cuda):
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(50, 6, generator=g)
    labels = torch.randint(0, 6, (50,), generator=g)
    # brute force: rank of the true class, per-class recall by loops
    rank = [(scores[i] > scores[i, labels[i]]).sum().item() for i in range(50)]
    recalls = [
        sum(rank[i] == 0 for i in range(50) if labels[i] == c) / int((labels == c).sum())
        for c in range(6)
        if (labels == c).any()
    ]
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        out = zero_shot_accuracy(scores.to("cuda"), labels.to("cuda"), topk=(1, 3))
    finally:
        torch.use_deterministic_algorithms(previous)
    assert out["top1"] == pytest.approx(sum(r == 0 for r in rank) / 50)
    assert out["top3"] == pytest.approx(sum(r < 3 for r in rank) / 50)
    assert out["mean_per_class_recall"] == pytest.approx(sum(recalls) / len(recalls))
