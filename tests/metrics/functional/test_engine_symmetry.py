"""The engine's metrics do not depend on ``block_size``: in leave-one-out on one
embedding set, s(i, j) and s(j, i) are one value (one tie) whatever the blocks,
and scores that are exact in floating point keep every tie (duplicated items).

References: one full float64 score matrix, symmetrised, ranked by the brute-force
rules of ``test_retrieval.py`` (scikit-learn AP, tied negatives first for R@k)."""

from __future__ import annotations

import math

import pytest
import torch

from rl_gap.metrics.functional import evaluate_embeddings
from tests.metrics.functional.test_retrieval import ref_gap, ref_map, ref_recall_at_k

KS = (1, 3)
KEYS = ("gap", "gap_no_distractors", "map", "r@1", "r@3")


def _metrics(queries, database, labels_q, labels_d, block, exclude_self):
    out = evaluate_embeddings(
        queries, database, labels_q, labels_d, exclude_self=exclude_self, ks=KS,
        precisions=(), ceiling=False, block_size=block,
    )  # fmt: skip
    return {key: out[key] for key in KEYS}


def _reference(scores, rel, valid):
    """Brute-force metrics of one materialised float64 score matrix."""
    scores, rel, valid = scores.double(), rel.clone(), valid.clone()
    has_pos = (rel & valid).any(1)
    return {
        "gap": ref_gap(scores, rel, valid),
        "gap_no_distractors": ref_gap(scores[has_pos], rel[has_pos], valid[has_pos]),
        "map": ref_map(scores, rel & valid, valid),
        "r@1": ref_recall_at_k(scores, rel & valid, valid, 1),
        "r@3": ref_recall_at_k(scores, rel & valid, valid, 3),
    }


def _symmetrised(scores):
    """Each unordered pair takes its upper-triangle value (one similarity, one tie)."""
    return scores.triu() + scores.triu(1).T


def _check_against_every_block(run, size: int, reference: dict) -> None:
    first = run(2048)
    for key in KEYS:
        assert first[key] == pytest.approx(reference[key], rel=1e-12, abs=1e-12), key
    differ = {b: run(b) for b in range(1, size + 1)}
    differ = {b: out for b, out in differ.items() if out != first}
    assert not differ, {b: (out, first) for b, out in list(differ.items())[:2]}


def _gaussian(n: int, dim: int, dtype, seed: int) -> torch.Tensor:
    """Embeddings whose dot products round differently in GEMMs of different shapes."""
    return torch.randn(n, dim, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_leave_one_out_each_pair_is_one_value_for_every_block_size(dtype):
    n = 30
    x = _gaussian(n, 16, dtype, 0)
    labels = torch.randint(0, 5, (n,), generator=torch.Generator().manual_seed(1))
    rel = labels[:, None] == labels[None]
    valid = ~torch.eye(n, dtype=torch.bool)
    reference = _reference(_symmetrised(x @ x.T), rel, valid)
    _check_against_every_block(lambda b: _metrics(x, None, labels, None, b, True), n, reference)


def _integer_with_duplicates(n: int, dim: int, seed: int) -> torch.Tensor:
    """float64 small integers (every dot product exact in any summation order, many
    exact ties) with a few rows repeated far apart, so duplicates straddle blocks."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, (n, dim), generator=g).double()
    x[n - 1], x[n // 2], x[3] = x[0], x[1], x[n - 2]
    return x


def test_ties_and_duplicates_leave_one_out_every_block_size():
    n = 26
    x = _integer_with_duplicates(n, 4, 2)
    labels = torch.randint(0, 4, (n,), generator=torch.Generator().manual_seed(3))
    labels[n - 1] = labels[0]
    rel = labels[:, None] == labels[None]
    valid = ~torch.eye(n, dtype=torch.bool)
    reference = _reference(x @ x.T, rel, valid)
    _check_against_every_block(lambda b: _metrics(x, None, labels, None, b, True), n, reference)


def test_ties_and_duplicates_separate_database_every_block_size():
    q = _integer_with_duplicates(12, 4, 4)
    d = _integer_with_duplicates(25, 4, 5)
    g = torch.Generator().manual_seed(6)
    ql, dl = torch.randint(0, 4, (12,), generator=g), torch.randint(0, 5, (25,), generator=g)
    rel = ql[:, None] == dl[None]
    valid = torch.ones_like(rel)
    reference = _reference(q @ d.T, rel, valid)
    assert not math.isnan(reference["gap"])
    _check_against_every_block(lambda b: _metrics(q, d, ql, dl, b, False), 25, reference)
