"""gAP with / without distractor queries, per-query metrics, query-side score normalisation.

References: scikit-learn's ``average_precision_score`` on the flattened
(query, database) pairs in float64, and hand computations.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from rl_gap.metrics.distractor import distractor_metrics
from rl_gap.metrics.functional import (
    ScoreNorm,
    background_offsets,
    normalize_scores,
    offset_embeddings,
)


def _problem(seed: int = 0, dtype=torch.float64):
    """12 queries (5 distractors, label -1), 15 database items, 9 background items."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(36, 6, generator=g, dtype=torch.float64), dim=1)
    q_lab = torch.tensor([0, 1, 2, 3, 4, 0, 2, -1, -1, -1, -1, -1])
    d_lab = torch.tensor([0, 0, 1, 2, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    labels = torch.cat([q_lab, d_lab, torch.full((9,), -2)])
    roles = torch.tensor([0] * 12 + [1] * 15 + [2] * 9)
    return emb.to(dtype), labels, roles


def _reference(scores: np.ndarray, rel: np.ndarray, k: int = 1) -> dict[str, float]:
    """float64 references: gAP on all rows / rows with a positive, mAP, R@k."""
    pos = rel.any(1)
    out = {
        "gap": average_precision_score(rel.ravel(), scores.ravel()),
        "gap_no_distractors": average_precision_score(rel[pos].ravel(), scores[pos].ravel()),
        "map": float(
            np.mean([average_precision_score(r, s) for r, s in zip(rel[pos], scores[pos])])
        ),
    }
    top = np.argsort(-scores[pos], axis=1, kind="stable")[:, :k]
    out[f"r@{k}"] = float(np.mean(np.take_along_axis(rel[pos], top, 1).any(1)))
    return out


def _scores(emb, labels, roles):
    q, d = emb[roles == 0].double(), emb[roles == 1].double()
    rel = (labels[roles == 0][:, None] == labels[roles == 1][None, :]).numpy()
    return (q @ d.T).numpy(), rel


def test_gap_with_and_without_distractors_vs_sklearn():
    emb, labels, roles = _problem()
    metrics, _ = distractor_metrics(emb, labels, roles, ks=(1,))
    scores, rel = _scores(emb, labels, roles)
    ref = _reference(scores, rel)
    for key, value in ref.items():
        assert metrics[key] == pytest.approx(value, abs=1e-12), key
    assert metrics["gap"] < metrics["gap_no_distractors"]  # distractor pairs only add negatives
    assert metrics["num_distractor_queries"] == 5 and metrics["num_recall_queries"] == 7
    assert metrics["num_pairs"] == 12 * 15


def test_background_offsets_by_hand():
    queries = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    background = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [-1.0, 0.0]])
    # q0 scores 1, .6, 0, -1; q1 scores 0, .8, 1, 0 -> top-3 means (1.6/3, 1.8/3)
    offsets = background_offsets(queries, background, ScoreNorm())
    assert offsets.tolist() == pytest.approx([1.6 / 3, 0.6], abs=1e-7)
    # beta 0.5, only the second neighbour: 0.5 * 0.6, 0.5 * 0.8
    offsets = background_offsets(queries, background, ScoreNorm(0.5, 1, 1), block_size=1)
    assert offsets.tolist() == pytest.approx([0.3, 0.4], abs=1e-7)
    scores = torch.tensor([[0.9, 0.2], [0.5, 0.45]])
    assert normalize_scores(scores, offsets).flatten().tolist() == pytest.approx(
        [0.6, -0.1, 0.1, 0.05], abs=1e-7
    )
    q_aug, d_aug = offset_embeddings(queries, queries, offsets)
    assert (q_aug @ d_aug.T).flatten().tolist() == pytest.approx([0.7, -0.3, -0.4, 0.6], abs=1e-7)


def test_normalised_metrics_vs_sklearn():
    emb, labels, roles = _problem(1)
    norm = ScoreNorm(beta=1.0, first=0, last=2)
    metrics, _ = distractor_metrics(emb, labels, roles, ks=(1,), score_norm=norm)
    scores, rel = _scores(emb, labels, roles)
    b = emb[roles == 2].double()
    q = emb[roles == 0].double()
    offsets = np.sort((q @ b.T).numpy(), axis=1)[:, ::-1][:, :3].mean(1)  # hand: top-3 mean
    ref = _reference(scores - offsets[:, None], rel)
    for key, value in ref.items():
        assert metrics[f"norm_{key}"] == pytest.approx(value, abs=1e-12), key
    assert metrics["norm_gap"] != pytest.approx(metrics["gap"], abs=1e-6)  # it changes gAP
    assert metrics["norm_map"] == pytest.approx(metrics["map"], abs=1e-12)  # not per-query AP


def test_normalised_ranking_under_autocast():
    emb, labels, roles = _problem(2, dtype=torch.float32)
    scores, rel = _scores(emb, labels, roles)
    q, b = emb[roles == 0].double(), emb[roles == 2].double()
    offsets64 = np.sort((q @ b.T).numpy(), axis=1)[:, ::-1][:, :3].mean(1)
    ref = _reference(scores - offsets64[:, None], rel)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        offsets = background_offsets(emb[roles == 0], emb[roles == 2])
        metrics, _ = distractor_metrics(emb, labels, roles, ks=(1,), score_norm=ScoreNorm())
    assert offsets.dtype == torch.float32
    assert offsets.numpy() == pytest.approx(offsets64, abs=1e-6)
    for key, value in ref.items():
        assert metrics[f"norm_{key}"] == pytest.approx(value, abs=1e-9), key


def test_bad_inputs_are_named():
    emb, labels, roles = _problem()
    with pytest.raises(ValueError, match="first"):
        ScoreNorm(first=3, last=1)
    with pytest.raises(ValueError, match="at least 4 background items"):
        background_offsets(emb[:2], emb[:3], ScoreNorm(first=0, last=3))
    bad = emb.clone()
    bad[30, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        distractor_metrics(bad, labels, roles, score_norm=ScoreNorm())
    with pytest.raises(ValueError, match="unknown role 7"):
        distractor_metrics(emb, labels, torch.where(roles == 2, 7, roles))
    with pytest.raises(ValueError, match="background"):
        distractor_metrics(emb, labels, torch.where(roles == 2, 1, roles), score_norm=ScoreNorm())
    with pytest.raises(ValueError, match="0 queries"):
        distractor_metrics(emb, labels, torch.ones_like(roles))
    with pytest.raises(ValueError, match="one per query"):
        normalize_scores(torch.zeros(3, 4), torch.zeros(4))


@pytest.mark.parametrize("exclude_self", [False, True])
def test_evaluate_embeddings_background_option_vs_sklearn(exclude_self):
    from rl_gap.metrics.functional import evaluate_embeddings, evaluate_scores

    g = torch.Generator().manual_seed(3)
    emb = torch.nn.functional.normalize(torch.randn(30, 5, generator=g, dtype=torch.float64), dim=1)
    q, b = emb[:14], emb[14:]
    q_lab = torch.tensor([0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 5, 6, 7, 8])
    db, d_lab = (None, q_lab) if exclude_self else (emb[:14].flip(0) * 0.9, q_lab.flip(0))
    norm = ScoreNorm(beta=0.7, first=1, last=3)
    got = evaluate_embeddings(
        q, db, q_lab, d_lab, exclude_self=exclude_self, background=b, score_norm=norm,
        ks=(1,), protocol=True,
    )  # fmt: skip
    d = q if db is None else db
    offsets = 0.7 * np.sort((q @ b.T).numpy(), axis=1)[:, ::-1][:, 1:4].mean(1)  # by hand
    scores = (q @ d.T).numpy() - offsets[:, None]
    rel = (q_lab[:, None] == d_lab[None, :]).numpy()
    valid = ~np.eye(14, dtype=bool) if exclude_self else np.ones((14, 14), dtype=bool)
    assert got["gap"] == pytest.approx(
        average_precision_score(rel[valid], scores[valid]), abs=1e-12
    )
    keep = (rel & valid).any(1)
    aps = [
        average_precision_score(r[v], s[v]) for r, s, v in zip(rel[keep], scores[keep], valid[keep])
    ]
    assert got["map"] == pytest.approx(np.mean(aps), abs=1e-12)
    # the threshold protocol ranks the same shifted scores (dense path on the matrix)
    dense = evaluate_scores(
        torch.from_numpy(scores), torch.from_numpy(rel), torch.from_numpy(valid),
        query_labels=q_lab, database_labels=d_lab,
    )  # fmt: skip
    for key in [k for k in dense if k.startswith("protocol_")]:
        assert got[key] == pytest.approx(dense[key], abs=1e-12, nan_ok=True), key
    assert got["num_distractor_queries"] == float((~keep).sum())
    with pytest.raises(ValueError, match="background"):
        evaluate_embeddings(q, None, q_lab, exclude_self=True, score_norm=norm)
