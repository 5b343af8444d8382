"""Threshold protocol: each half of the classes is its own retrieval problem (hand-computed)."""

from __future__ import annotations

import pytest
import torch

from rl_gap.metrics.functional import (
    evaluate_embeddings,
    evaluate_scores,
    protocol_halves,
    threshold_protocol,
)


def _toy() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """8 items, 2 per class; classes 0, 1 form the fit half and 2, 3 the eval half
    (seed 0, asserted). Scores (symmetric, self pairs invalid):

    fit half  a1 a2 | b1 b2:  s(a1,a2) = 0.9, s(b1,b2) = 0.5, s(a_i, b_j) = 0.6
    eval half c1 c2 | d1 d2:  s(c1,c2) = 0.95, s(d1,d2) = 0.8, s(c1,d1) = 0.92,
                              other s(c_i, d_j) = 0.1
    across the halves: 0.97 (these pairs belong to no problem of the protocol).
    """
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    q_half, d_half = protocol_halves(labels, labels, seed=0)
    assert q_half.tolist() == [0, 0, 0, 0, 1, 1, 1, 1] == d_half.tolist()
    s = torch.full((8, 8), 0.97, dtype=torch.float64)
    s[:4, :4] = 0.6
    s[4:, 4:] = 0.1
    pairs = {(0, 1): 0.9, (2, 3): 0.5, (4, 5): 0.95, (6, 7): 0.8, (4, 6): 0.92}
    for (i, j), v in pairs.items():
        s[i, j] = s[j, i] = v
    rel = labels[:, None] == labels[None]
    valid = ~torch.eye(8, dtype=torch.bool)
    return s, rel, valid, labels


# Hand computation.
# Fit problem (4 positives, 8 negatives at 0.6): threshold 0.9 -> TP 2, FP 0,
#   F1 = 2*2 / (2 + 0 + 4) = 2/3; threshold 0.5 -> TP 4, FP 8, F1 = 8/16 = 1/2.
#   Shared F1 threshold 0.9; precision >= 0.9 only at 0.9 (recall 1/2) -> 0.9.
# Eval problem at 0.9: TP 2 (c1-c2 both ways), FP 2 (c1-d1 both ways, 0.92),
#   4 positives: F1g = 2*2 / (2 + 2 + 4) = 1/2, R@P90 = 2/4 = 1/2.
# F1q over the eval queries: c1 1 (0.95 above its negatives), c2 1, d2 1,
#   d1 2/3 (its positive 0.8 is below c1 at 0.92: TP 1, FP 1 -> 2/(1+1+1)):
#   F1q = (3 + 2/3) / 4 = 11/12.
HAND = {"f1g": 0.5, "r@p90": 0.5, "f1q": 11 / 12, "threshold_f1": 0.9, "threshold_p90": 0.9}


def test_protocol_halves_are_separate_problems_hand_computed():
    s, rel, valid, labels = _toy()
    out = evaluate_scores(s, rel, valid, query_labels=labels, database_labels=labels, ceiling=False)
    for key, value in HAND.items():
        assert out[f"protocol_{key}"] == pytest.approx(value, abs=1e-12), key
    wrapper = threshold_protocol(s, rel, valid, query_labels=labels, database_labels=labels)
    for key in ("f1g", "r@p90", "f1q"):
        assert float(wrapper[key]) == pytest.approx(HAND[key], abs=1e-12), key


def test_protocol_from_embeddings_matches_hand_computation():
    # Embeddings whose dot products are the toy's scores: Cholesky of s + c*I (positive
    # definite) gives x with x x^T = s + c I; the diagonal (self pairs) is excluded anyway.
    s, _, _, labels = _toy()
    gram = s.clone()
    gram.diagonal().fill_(4.0)
    x = torch.linalg.cholesky(gram)
    assert torch.allclose(x @ x.T, gram, atol=1e-12)
    out = evaluate_embeddings(x, x, labels, labels, exclude_self=True, protocol=True)
    for key in ("f1g", "r@p90", "f1q"):
        assert out[f"protocol_{key}"] == pytest.approx(HAND[key], abs=1e-9), key


def test_protocol_needs_two_classes():
    s = torch.rand(6, 6, dtype=torch.float64)
    rel = torch.ones(6, 6, dtype=torch.bool)
    labels = torch.zeros(6, dtype=torch.long)
    with pytest.raises(ValueError, match="at least 2"):
        evaluate_scores(s, rel, query_labels=labels, database_labels=labels)
    x = torch.randn(6, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="at least 2"):
        evaluate_embeddings(x, x, labels, labels, exclude_self=True, protocol=True)


def test_protocol_fit_half_without_positives_is_an_error():
    # Leave-one-out with singleton classes only: the fit half has no positive pair.
    x = torch.randn(6, 3, dtype=torch.float64)
    labels = torch.arange(6)
    with pytest.raises(ValueError, match="fit half has no positive"):
        evaluate_embeddings(x, x, labels, labels, exclude_self=True, protocol=True)


def test_protocol_needs_database_labels_for_a_matrix():
    s, rel, valid, labels = _toy()
    with pytest.raises(ValueError, match="database_labels"):
        evaluate_scores(s, rel, valid, query_labels=labels)


def test_training_callback_reports_nan_protocol_with_the_reason(caplog):
    # An evaluation split with one class: the callback's other metrics stand, the
    # protocol keys are NaN and the log says why (the functional API raises instead).
    from rl_gap.callbacks.retrieval import evaluation_metrics

    x = torch.nn.functional.normalize(torch.randn(8, 3, dtype=torch.float64), dim=1)
    labels = torch.zeros(8, dtype=torch.long)
    with caplog.at_level("WARNING"):
        out, _ = evaluation_metrics(x, labels, ks=(1,))
    assert "at least 2" in caplog.text
    assert all(out[f"protocol_{k}"] != out[f"protocol_{k}"] for k in ("f1g", "r@p90", "f1q"))
    assert out["gap"] == 1.0 and out["r@1"] == 1.0  # every pair is positive
