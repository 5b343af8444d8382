"""Functional retrieval metrics vs scikit-learn and plain brute force (float64)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from rl_gap.metrics.functional import (
    evaluate_scores,
    global_ap,
    global_f1,
    mean_ap,
    per_query_f1,
    recall_at_k,
    recall_at_precision,
)


def _problem(seed: int, q: int = 9, d: int = 60, decimals: int = 2, p_rel: float = 0.15):
    """Heavy ties (rounded scores), one row without positives, a random valid mask."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.round(torch.rand(q, d, generator=g, dtype=torch.float64) * 10**decimals)
    scores = scores / 10**decimals - 0.5
    rel = torch.rand(q, d, generator=g) < p_rel
    rel[1] = False
    valid = torch.rand(q, d, generator=g) < 0.85
    return scores, rel, valid


def _rows(scores, rel, valid):
    for i in range(scores.shape[0]):
        m = valid[i].numpy()
        yield scores[i].numpy()[m], rel[i].numpy()[m]


# ---------------------------------------------------------------- references
def ref_gap(scores, rel, valid):
    m = valid.numpy()
    return average_precision_score(rel.numpy()[m], scores.numpy()[m])


def ref_map(scores, rel, valid):
    aps = [average_precision_score(r, s) for s, r in _rows(scores, rel, valid) if r.any()]
    return float(np.mean(aps))


def ref_map_at_k(scores, rel, valid, k):
    aps = []
    for s, r in _rows(scores, rel, valid):
        if not r.any():
            continue
        total = 0.0
        for i in np.flatnonzero(r):
            rank = np.sum(s >= s[i])
            if rank <= k:
                total += np.sum(r & (s >= s[i])) / rank
        aps.append(total / min(k, r.sum()))
    return float(np.mean(aps))


def ref_recall_at_k(scores, rel, valid, k):
    hits = []
    for s, r in _rows(scores, rel, valid):
        if not r.any():
            continue
        order = sorted(range(len(s)), key=lambda j: (-s[j], bool(r[j])))  # tied negatives first
        hits.append(any(r[j] for j in order[:k]))
    return float(np.mean(hits))


def _sweep(s, r):
    """(threshold, tp, fp) for every distinct score as threshold."""
    return [(t, np.sum(r & (s >= t)), np.sum(~r & (s >= t))) for t in np.unique(s)]


def ref_recall_at_precision(scores, rel, valid, p):
    m = valid.numpy()
    s, r = scores.numpy()[m], rel.numpy()[m]
    best = 0.0
    for _, tp, fp in _sweep(s, r):
        if tp / (tp + fp) >= p:
            best = max(best, tp / r.sum())
    return best


def ref_global_f1(scores, rel, valid):
    m = valid.numpy()
    s, r = scores.numpy()[m], rel.numpy()[m]
    return max(2 * tp / (tp + fp + r.sum()) for _, tp, fp in _sweep(s, r))


def ref_query_f1(scores, rel, valid):
    best = []
    for s, r in _rows(scores, rel, valid):
        if r.any():
            best.append(max(2 * tp / (tp + fp + r.sum()) for _, tp, fp in _sweep(s, r)))
    return float(np.mean(best))


# --------------------------------------------------------------------- tests
@pytest.mark.parametrize("seed", range(6))
def test_gap_and_map_match_sklearn(seed):
    scores, rel, valid = _problem(seed)
    gap = global_ap(scores, rel, valid)
    assert gap.dtype == torch.float64 and gap.ndim == 0
    assert abs(float(gap) - ref_gap(scores, rel, valid)) < 1e-12
    assert abs(float(mean_ap(scores, rel, valid)) - ref_map(scores, rel, valid)) < 1e-12


def test_no_valid_mask_and_distractor_rows_count_in_gap():
    scores, rel, _ = _problem(11, q=6)
    full = torch.ones_like(rel)
    assert abs(float(global_ap(scores, rel)) - ref_gap(scores, rel, full)) < 1e-12
    # The row without positives adds negatives to gAP but not to mAP.
    without = global_ap(scores[[0, *range(2, 6)]], rel[[0, *range(2, 6)]])
    assert float(without) != float(global_ap(scores, rel))
    assert float(mean_ap(scores, rel)) == pytest.approx(ref_map(scores, rel, full), abs=1e-12)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 3, 10, 100])
def test_map_at_k_and_recall_at_k_brute_force(seed, k):
    scores, rel, valid = _problem(seed, decimals=1)
    assert (
        abs(float(mean_ap(scores, rel, valid, k=k)) - ref_map_at_k(scores, rel, valid, k)) < 1e-12
    )
    assert float(recall_at_k(scores, rel, valid, k=k)) == pytest.approx(
        ref_recall_at_k(scores, rel, valid, k), abs=1e-12
    )


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("precision", [0.3, 0.5, 0.9])
def test_recall_at_precision_and_f1_brute_force_sweep(seed, precision):
    scores, rel, valid = _problem(seed, p_rel=0.4)
    got = float(recall_at_precision(scores, rel, valid, precision=precision))
    assert got == pytest.approx(ref_recall_at_precision(scores, rel, valid, precision), abs=1e-12)
    assert float(global_f1(scores, rel, valid)) == pytest.approx(
        ref_global_f1(scores, rel, valid), abs=1e-12
    )
    assert float(per_query_f1(scores, rel, valid)) == pytest.approx(
        ref_query_f1(scores, rel, valid), abs=1e-12
    )


def test_recall_at_precision_reaches_nonzero_value():
    # Positives mostly on top: R@P90 > 0, checks the qualifying branch.
    g = torch.Generator().manual_seed(3)
    rel = torch.rand(20, 30, generator=g) < 0.3
    scores = torch.rand(20, 30, generator=g, dtype=torch.float64) + rel.double() * 0.8
    scores = torch.round(scores * 50) / 50
    full = torch.ones_like(rel)
    ref = ref_recall_at_precision(scores, rel, full, 0.9)
    assert ref > 0.2
    assert float(recall_at_precision(scores, rel)) == pytest.approx(ref, abs=1e-12)


def test_threshold_protocol_brute_force():
    g = torch.Generator().manual_seed(5)
    labels = torch.randint(0, 8, (40,), generator=g)
    emb = torch.randn(40, 4, generator=g, dtype=torch.float64)
    scores = torch.round((emb @ emb.T) * 20) / 20 + 3.0 * (labels[:, None] == labels[None]).double()
    scores = torch.round(scores * 4) / 4
    rel = labels[:, None] == labels[None]
    valid = ~torch.eye(40, dtype=torch.bool)
    out = evaluate_scores(
        scores, rel, valid, query_labels=labels, database_labels=labels, ceiling=False
    )
    from rl_gap.metrics.functional import split_classes

    half = split_classes(labels).numpy().astype(bool)
    m = valid.numpy()

    def flat(rows):
        # each half is its own problem: its rows against its columns only
        sel = m & rows[:, None] & rows[None, :]
        return scores.numpy()[sel], rel.numpy()[sel]

    s_fit, r_fit = flat(~half)
    s_ev, r_ev = flat(half)
    sweep = _sweep(s_fit, r_fit)
    f1s = [(2 * tp / (tp + fp + r_fit.sum()), t) for t, tp, fp in sweep]
    best_f1 = max(f for f, _ in f1s)
    t_f1 = min(t for f, t in f1s if f == best_f1)
    rec = [(tp / r_fit.sum(), t) for t, tp, fp in sweep if tp / (tp + fp) >= 0.9]
    t_p = max(t for r, t in rec if r == max(r for r, _ in rec)) if rec else math.inf
    tp = np.sum(r_ev & (s_ev >= t_f1))
    fp = np.sum(~r_ev & (s_ev >= t_f1))
    assert out["protocol_f1g"] == pytest.approx(2 * tp / (tp + fp + r_ev.sum()), abs=1e-12)
    assert out["protocol_r@p90"] == pytest.approx(
        np.sum(r_ev & (s_ev >= t_p)) / r_ev.sum(), abs=1e-12
    )
    h = torch.from_numpy(half)
    assert out["protocol_f1q"] == pytest.approx(
        ref_query_f1(scores[h][:, h], rel[h][:, h], valid[h][:, h]), abs=1e-12
    )


def test_increasing_row_transform_keeps_map_and_recall_changes_gap():
    """gSAP paper App. E: per-row monotone maps keep per-query metrics, not gAP."""
    scores, rel, valid = _problem(7, decimals=2)
    a = torch.linspace(0.5, 3.0, scores.shape[0], dtype=torch.float64)[:, None]
    b = torch.linspace(-1.0, 1.0, scores.shape[0], dtype=torch.float64)[:, None]
    warped = a * scores**3 + a * scores + b  # strictly increasing per row
    assert float(mean_ap(warped, rel, valid)) == pytest.approx(
        float(mean_ap(scores, rel, valid)), abs=1e-12
    )
    for k in (1, 5):
        assert float(recall_at_k(warped, rel, valid, k=k)) == float(
            recall_at_k(scores, rel, valid, k=k)
        )
    assert abs(float(global_ap(warped, rel, valid)) - float(global_ap(scores, rel, valid))) > 1e-3


def test_nonpositive_cosine_scores_stay_positives():
    # torchmetrics >= 1.7.4 drops positives scoring <= 0; we must not.
    scores, rel, valid = _problem(2)
    scores = scores - 1.0  # every score < 0
    assert float(global_ap(scores, rel, valid)) == pytest.approx(
        ref_gap(scores, rel, valid), abs=1e-12
    )
    assert float(mean_ap(scores, rel, valid)) == pytest.approx(
        ref_map(scores, rel, valid), abs=1e-12
    )


def test_float32_scores_give_float32_and_1d_input():
    scores, rel, valid = _problem(1)
    out = global_ap(scores.float(), rel, valid)
    assert out.dtype == torch.float32
    row = mean_ap(scores[0], rel[0])
    assert float(row) == pytest.approx(average_precision_score(rel[0], scores[0]), abs=1e-12)


def test_no_positive_gives_nan():
    scores, rel, _ = _problem(0)
    assert math.isnan(float(global_ap(scores, torch.zeros_like(rel))))


@pytest.mark.parametrize(
    "case, message",
    [
        ("nan", "NaN or inf"),
        ("inf", "NaN or inf"),
        ("empty", "empty"),
        ("shape", "does not match"),
        ("dtype", "floating point"),
        ("rel_values", "0/1"),
    ],
)
def test_bad_input_raises(case, message):
    scores, rel, valid = _problem(0)
    if case == "nan":
        scores[0, 0] = float("nan")
        valid[0, 0] = True
    elif case == "inf":
        scores[2, 3] = float("inf")
        valid[2, 3] = True
    elif case == "empty":
        scores, rel, valid = scores[:0], rel[:0], valid[:0]
    elif case == "shape":
        rel = rel[:, :-1]
    elif case == "dtype":
        scores = scores.long()
    elif case == "rel_values":
        rel = rel.long() * 2
    with pytest.raises(ValueError, match=message):
        global_ap(scores, rel, valid)


def test_nan_at_invalid_pairs_is_ignored():
    scores, rel, valid = _problem(4)
    noisy = scores.clone()
    noisy[~valid] = float("nan")
    assert float(global_ap(noisy, rel, valid)) == float(global_ap(scores, rel, valid))


def test_protocol_and_ceiling_wrappers_match_suite():
    from rl_gap.metrics.functional import consistency_ceiling, threshold_protocol

    g = torch.Generator().manual_seed(9)
    labels = torch.randint(0, 6, (30,), generator=g)
    scores = torch.round(torch.rand(30, 30, generator=g, dtype=torch.float64) * 20) / 20
    scores = scores + (labels[:, None] == labels[None]).double() * 0.5
    rel = labels[:, None] == labels[None]
    valid = ~torch.eye(30, dtype=torch.bool)
    suite = evaluate_scores(
        scores, rel, valid, query_labels=labels, database_labels=labels, ceiling=True
    )
    proto = threshold_protocol(scores, rel, valid, query_labels=labels, database_labels=labels)
    for key in ("f1g", "r@p90", "f1q"):
        assert float(proto[key]) == pytest.approx(suite[f"protocol_{key}"], abs=1e-12)
    ceiling = consistency_ceiling(scores, rel, valid)
    assert float(ceiling["ceiling"]) == pytest.approx(suite["ceiling"], abs=1e-12)
    assert float(ceiling["efficiency"]) == pytest.approx(suite["efficiency"], abs=1e-12)
