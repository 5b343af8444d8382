"""Zero-shot accuracy: rank of the true class (ties count against it), top-k and the mean
per-class recall against a per-sample Python loop."""

from __future__ import annotations

import pytest
import torch

from rl_gap.metrics.zero_shot import true_class_rank, zero_shot_accuracy


def _reference(scores: torch.Tensor, labels: torch.Tensor, ks) -> dict[str, float]:
    rows = scores.tolist()
    ranks = [
        sum(1 for c, s in enumerate(row) if c != y and s >= row[y])
        for row, y in zip(rows, labels.tolist())
    ]
    out = {f"top{k}": sum(r < k for r in ranks) / len(ranks) for k in ks}
    recalls = []
    for c in sorted(set(labels.tolist())):
        hits = [r == 0 for r, y in zip(ranks, labels.tolist()) if y == c]
        recalls.append(sum(hits) / len(hits))
    out["mean_per_class_recall"] = sum(recalls) / len(recalls)
    return out


def test_accuracies_match_a_per_sample_loop_with_ties():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (60, 7), generator=g).float()  # many ties
    labels = torch.randint(0, 6, (60,), generator=g)  # class 6 has no sample
    out = zero_shot_accuracy(scores, labels, topk=(1, 3, 10))
    assert out == pytest.approx(_reference(scores, labels, (1, 3, 10)), abs=1e-12)


def test_a_tie_with_the_true_class_is_not_a_hit():
    scores = torch.tensor([[1.0, 1.0, 0.0], [0.0, 2.0, 1.0]])
    assert true_class_rank(scores, torch.tensor([0, 1])).tolist() == [1, 0]


@pytest.mark.parametrize(
    "scores, labels, message",
    [
        (torch.zeros(3), torch.zeros(3, dtype=torch.long), r"scores must be \(N, C\)"),
        (torch.zeros(0, 2), torch.zeros(0, dtype=torch.long), "empty set"),
        (torch.tensor([[float("nan"), 0.0]]), torch.tensor([0]), "without NaN"),
        (torch.zeros(1, 2), torch.tensor([0.0]), "integer class indices"),
        (torch.zeros(1, 2), torch.tensor([2]), r"labels must lie in \[0, 2\)"),
    ],
)
def test_bad_inputs_are_named(scores, labels, message):
    with pytest.raises(ValueError, match=message):
        zero_shot_accuracy(scores, labels)
