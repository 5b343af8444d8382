"""R@P: a threshold whose precision *equals* the level qualifies (``>=``, not ``>``)."""

import pytest
import torch

from rl_gap.metrics.functional import evaluate_embeddings, recall_at_precision


def _brute_recall_at_precision(scores, rel, level):
    """Largest recall over every threshold t (precision of {s >= t} >= level), float64 loops."""
    pairs = list(zip(scores, rel, strict=True))
    total = sum(r for _, r in pairs)
    best = 0.0
    for t in sorted({s for s, _ in pairs}):
        kept = [r for s, r in pairs if s >= t]
        tp = sum(kept)
        if tp / len(kept) >= level:
            best = max(best, tp / total)
    return best


CASES = [
    # precision exactly 1/2 at the positive's threshold (the case)
    ([0.9, 0.95], [True, False], 0.5),
    # nine positives under one negative: precision exactly 9/10 at the lowest positive
    ([0.95, *[0.1 * i for i in range(1, 10)]], [False, *[True] * 9], 0.9),
    # precision exactly 3/4 with a tie group at the threshold
    ([0.8, 0.5, 0.5, 0.5, 0.2], [True, False, True, True, False], 0.75),
]


@pytest.mark.parametrize("scores, rel, level", CASES)
def test_recall_at_precision_counts_a_threshold_exactly_at_the_level(scores, rel, level):
    expected = _brute_recall_at_precision(scores, rel, level)
    assert expected == 1.0  # every case reaches full recall only at precision == level
    got = recall_at_precision(
        torch.tensor([scores], dtype=torch.float64), torch.tensor([rel]), precision=level
    )
    assert float(got) == expected


@pytest.mark.parametrize("scores, rel, level", CASES)
def test_engine_recall_at_precision_counts_a_threshold_exactly_at_the_level(scores, rel, level):
    # one query q = [1] against 1-d database items: the similarity is the item itself
    queries = torch.ones(1, 1, dtype=torch.float64)
    database = torch.tensor(scores, dtype=torch.float64).unsqueeze(1)
    labels = torch.tensor([1 if r else 2 for r in rel])
    out = evaluate_embeddings(queries, database, torch.tensor([1]), labels, precisions=(level,))
    key = "r@p" + ("50" if level == 0.5 else "90" if level == 0.9 else "75")
    assert out[key] == _brute_recall_at_precision(scores, rel, level) == 1.0
