"""MoCo's kNN metric counts each item once under DistributedSampler padding (dataset indices)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DistributedSampler

from rl_gap.metrics.knn import WeightedKNNAccuracy


def brute_force_top1(queries, query_labels, bank, bank_labels, k, temperature):
    """Weighted kNN top-1 by loops: the k most similar bank items vote exp(cos / T)."""
    hits = 0
    for q, y in zip(queries.tolist(), query_labels.tolist(), strict=True):
        qn = math.sqrt(sum(v * v for v in q))
        sims = []
        for b, label in zip(bank.tolist(), bank_labels.tolist(), strict=True):
            bn = math.sqrt(sum(v * v for v in b))
            sims.append((sum(x * z for x, z in zip(q, b, strict=True)) / (qn * bn), label))
        votes: dict[int, float] = {}
        for sim, label in sorted(sims, key=lambda t: -t[0])[:k]:
            votes[label] = votes.get(label, 0.0) + math.exp(sim / temperature)
        hits += max(votes, key=votes.get) == y
    return hits / len(queries)


def padded_shards(n: int, world: int = 2):
    """Dataset indices each rank sees with DistributedSampler (padded by repeats)."""
    return [
        list(DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=False))
        for r in range(world)
    ]


def test_padded_duplicates_counted_once():
    g = torch.Generator().manual_seed(0)
    bank, bank_labels = torch.randn(11, 4, generator=g), torch.randint(0, 3, (11,), generator=g)
    queries, query_labels = torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)
    ref = brute_force_top1(queries, query_labels, bank, bank_labels, k=3, temperature=0.5)
    results = {}
    for with_indices in (True, False):
        metric = WeightedKNNAccuracy(k=3, temperature=0.5, top_k=(1,))
        for which, feats, labels in (("bank", bank, bank_labels), ("query", queries, query_labels)):
            shards = padded_shards(feats.shape[0])
            assert sum(map(len, shards)) > feats.shape[0]  # the sampler repeated an item
            for shard in shards:  # what the DDP sync concatenates
                idx = torch.tensor(shard)
                metric.update(
                    feats[idx],
                    labels[idx],
                    bank=which == "bank",
                    indices=idx if with_indices else None,
                )
        results[with_indices] = float(metric.compute()["top1"])
        if with_indices:
            feats, labels = metric.rows("query")
            assert torch.equal(feats, torch.nn.functional.normalize(queries, dim=1))
            assert torch.equal(labels, query_labels)
    assert results[True] == pytest.approx(ref)
    assert results[False] != pytest.approx(ref)  # the padded copy counted twice


def test_indices_on_some_updates_only_is_an_error():
    metric = WeightedKNNAccuracy(k=1)
    metric.update(torch.randn(3, 2), torch.arange(3), bank=True, indices=torch.arange(3))
    metric.update(torch.randn(2, 2), torch.arange(2), bank=True)
    metric.update(torch.randn(2, 2), torch.arange(2))
    with pytest.raises(ValueError, match="indices with every update"):
        metric.compute()
    with pytest.raises(ValueError, match="indices must be"):
        metric.update(torch.randn(2, 2), torch.arange(2), indices=torch.zeros(3))


def test_synced_empty_index_state_means_no_indices():
    # After a DDP sync a list state nobody filled is an empty tensor, not an empty list.
    metric = WeightedKNNAccuracy(k=1, top_k=(1,))
    metric.update(torch.eye(3), torch.arange(3), bank=True)
    metric.update(torch.eye(3), torch.arange(3))
    metric.bank_indices = torch.zeros(0, dtype=torch.long)
    metric.query_indices = torch.zeros(0, dtype=torch.long)
    assert float(metric.compute()["top1"]) == 1.0
