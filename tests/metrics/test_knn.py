"""Weighted kNN classifier against a brute-force float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from rl_gap.metrics.knn import WeightedKNNAccuracy, weighted_knn_accuracy


def brute_force_knn(queries, bank, bank_labels, k, temperature, num_classes):
    """Plain loops in float64: cosine, k nearest, exp(s/T) votes, argmax (lowest class on ties)."""
    predictions, ranked = [], []
    for q in queries.tolist():
        qn = math.sqrt(sum(v * v for v in q))
        sims = []
        for j, b in enumerate(bank.tolist()):
            bn = math.sqrt(sum(v * v for v in b))
            sims.append((sum(x * y for x, y in zip(q, b)) / (qn * bn), j))
        sims.sort(key=lambda t: -t[0])
        votes = [0.0] * num_classes
        for s, j in sims[:k]:
            votes[int(bank_labels[j])] += math.exp(s / temperature)
        order = sorted(range(num_classes), key=lambda c: (-votes[c], c))
        predictions.append(order[0])
        ranked.append(order)
    return predictions, ranked


@pytest.mark.parametrize("k,temperature", [(20, 0.07), (5, 0.5), (1, 0.07)])
def test_weighted_knn_matches_brute_force(k, temperature):
    g = torch.Generator().manual_seed(k)
    num_classes = 6
    centers = torch.randn(num_classes, 8, generator=g)
    bank_labels = torch.randint(0, num_classes, (120,), generator=g)
    bank = centers[bank_labels] + 1.2 * torch.randn(120, 8, generator=g)
    query_labels = torch.randint(0, num_classes, (50,), generator=g)
    queries = centers[query_labels] + 1.2 * torch.randn(50, 8, generator=g)

    preds, ranked = brute_force_knn(
        queries.double(), bank.double(), bank_labels, k, temperature, num_classes
    )
    top1 = sum(p == int(y) for p, y in zip(preds, query_labels)) / 50
    top5 = sum(int(y) in r[:5] for r, y in zip(ranked, query_labels)) / 50
    assert 0.2 < top1 < 1.0  # a non-trivial case

    metric = WeightedKNNAccuracy(k=k, temperature=temperature, num_classes=num_classes)
    for i, start in enumerate(range(0, 120, 32)):  # several updates, interleaved
        metric.update(bank[start : start + 32], bank_labels[start : start + 32], bank=True)
        metric.update(queries[11 * i : 11 * i + 11], query_labels[11 * i : 11 * i + 11])
    metric.update(queries[44:], query_labels[44:])
    out = metric.compute()
    assert out["top1"].item() == pytest.approx(top1, abs=1e-12)
    assert out["top5"].item() == pytest.approx(top5, abs=1e-12)

    functional = weighted_knn_accuracy(queries, query_labels, bank, bank_labels, k, temperature)
    assert functional["top1"] == pytest.approx(top1, abs=1e-12)


def test_knn_class_vote_tie_goes_to_lowest_class_and_k_clamps():
    bank = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    out = weighted_knn_accuracy(
        torch.tensor([[1.0, 0.0]]), torch.tensor([3]), bank, torch.tensor([5, 3]), k=50
    )
    assert out["top1"] == 1.0  # equal votes for 3 and 5: class 3 wins


def test_knn_bad_inputs():
    metric = WeightedKNNAccuracy()
    with pytest.raises(ValueError, match="2-D"):
        metric.update(torch.randn(4), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="NaN"):
        metric.update(torch.full((2, 3), float("nan")), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        metric.update(torch.randn(2, 3), torch.zeros(2))
    with pytest.raises(ValueError, match="one entry per"):
        metric.update(torch.randn(2, 3), torch.zeros(3, dtype=torch.long), bank=True)
    with pytest.raises(ValueError, match="empty"):
        metric.update(torch.randn(0, 3), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="needs both"):
        metric.compute()


def test_knn_votes_under_autocast_are_float32_votes():
    from rl_gap.metrics.knn import weighted_knn_scores

    g = torch.Generator().manual_seed(7)
    bank, queries = torch.randn(200, 32, generator=g), torch.randn(20, 32, generator=g)
    bank_labels = torch.randint(0, 5, (200,), generator=g)
    # float64 brute force: top-10 cosine neighbours, weights exp(s / 0.07)
    b = torch.nn.functional.normalize(bank.double(), dim=1)
    q = torch.nn.functional.normalize(queries.double(), dim=1)
    sims, idx = (q @ b.T).topk(10, dim=1)
    ref = torch.zeros(20, 5, dtype=torch.float64)
    ref.scatter_add_(1, bank_labels[idx], (sims / 0.07).exp())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        votes = weighted_knn_scores(queries, bank, bank_labels, 5, k=10, temperature=0.07)
    assert votes.dtype == torch.float32
    torch.testing.assert_close(votes.double(), ref, rtol=1e-5, atol=0)


def loo_knn_reference(x, labels, k, temperature, tops=(1, 2)) -> dict[str, float]:
    """Leave-one-out weighted kNN by a float64 Python loop (class ties: smaller id first)."""
    x = x.double()
    unit = x / x.norm(dim=1, keepdim=True)
    classes = sorted(set(labels.tolist()))
    n = x.shape[0]
    hits = dict.fromkeys(tops, 0)
    scored = [i for i in range(n) if (labels == labels[i]).sum() > 1]  # a class-mate exists
    for i in scored:
        sims = sorted(((float(unit[i] @ unit[j]), j) for j in range(n) if j != i), reverse=True)
        votes = dict.fromkeys(classes, 0.0)
        for s, j in sims[:k]:
            votes[int(labels[j])] += math.exp(s / temperature)
        ranked = sorted(classes, key=lambda c: (-votes[c], c))
        for t in tops:
            hits[t] += int(labels[i]) in ranked[:t]
    return {f"top{t}": hits[t] / len(scored) for t in tops}


@pytest.mark.parametrize("k", [1, 3, 50])
def test_leave_one_out_knn_equals_a_python_loop(k):
    from rl_gap.metrics.knn import leave_one_out_knn_accuracy

    g = torch.Generator().manual_seed(k)
    x = torch.randn(23, 5, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 4, (23,), generator=g) * 7 - 3  # sparse, negative ids
    labels[:2] = torch.tensor([100, 101])  # alone in their class: vote, are not scored
    want = loo_knn_reference(x, labels, k, 0.1)
    out = leave_one_out_knn_accuracy(x, labels, k=k, temperature=0.1, top_k=(1, 2))
    assert out == pytest.approx(want, abs=1e-12)
    lonely = leave_one_out_knn_accuracy(x[:3], torch.tensor([1, 2, 3]))
    assert all(math.isnan(v) for v in lonely.values())
    from rl_gap.metrics.knn import weighted_knn_scores

    with pytest.raises(ValueError, match="at least 2 items"):
        weighted_knn_scores(x[:1], x[:1], labels[:1] * 0, 1, exclude_self=True)
