"""evaluate_embeddings as one call: cosine scores block by block (``normalize``), its
option checks, and its values against float64 brute force (scikit-learn)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from rl_gap.metrics.functional import evaluate_embeddings


def _problem(seed: int, num: int = 48, dim: int = 6, classes: int = 5):
    """Embeddings whose row norms vary 100-fold (dot and cosine rank differently)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num, dim, generator=g)
    x = x * torch.logspace(-1, 1, num)[torch.randperm(num, generator=g)][:, None]
    return x, torch.randint(0, classes, (num,), generator=g)


def _cosine_reference(queries, database, q_lab, d_lab, exclude_self: bool) -> dict[str, float]:
    """gAP, mAP and R@1 of cosine scores computed in float64 on the dense matrix."""
    q = queries.double() / queries.double().norm(dim=1, keepdim=True)
    d = database.double() / database.double().norm(dim=1, keepdim=True)
    scores = (q @ d.T).numpy()
    if exclude_self:  # (i, j) and (j, i) are one tied score, as the engine scores them once
        scores = (scores + scores.T) / 2
    rel = (q_lab[:, None] == d_lab[None, :]).numpy()
    valid = np.ones_like(rel)
    if exclude_self:
        np.fill_diagonal(valid, False)
    gap = average_precision_score(rel[valid], scores[valid])
    aps, hits = [], []
    for i in range(len(q_lab)):
        s, r = scores[i][valid[i]], rel[i][valid[i]]
        if r.any():
            aps.append(average_precision_score(r, s))
            hits.append(float(r[np.argmax(s)]))
    return {"gap": gap, "map": float(np.mean(aps)), "r@1": float(np.mean(hits))}


@pytest.mark.parametrize("exclude_self", [False, True])
def test_normalize_gives_float64_cosine_metrics_block_by_block(exclude_self):
    # float64 throughout: float32 cosines of 2k pairs hold near-ties that round apart
    x, labels = _problem(0)
    x = x.double()
    if exclude_self:
        queries, q_lab, database, d_lab = x, labels, None, labels
    else:  # distinct sets: no pair is scored twice (a tie in float32, not in float64)
        queries, q_lab, database, d_lab = x[:17], labels[:17], x[17:], labels[17:]
    # Leave-one-out: blocks that tile the set, so a mirrored pair is computed once (in a
    # partial diagonal block the two GEMM roundings of (i, j) and (j, i) untie it).
    block = 8 if exclude_self else 7
    out = evaluate_embeddings(
        queries, database, q_lab, d_lab, exclude_self=exclude_self, normalize=True,
        block_size=block, ks=(1,), ceiling=False,
    )  # fmt: skip
    ref = _cosine_reference(queries, x if exclude_self else database, q_lab, d_lab, exclude_self)
    for key, value in ref.items():
        assert out[key] == pytest.approx(value, abs=1e-12), key
    raw = evaluate_embeddings(
        queries, database, q_lab, d_lab, exclude_self=exclude_self, block_size=block, ks=(1,)
    )
    assert raw["gap"] != pytest.approx(ref["gap"], abs=1e-3)  # the norms matter here


def test_normalize_equals_normalising_first_with_every_metric():
    x, labels = _problem(1)
    options = {"exclude_self": True, "protocol": True, "bootstrap": 20, "map_at": (3,)}
    blockwise = evaluate_embeddings(
        x.numpy(), None, labels, normalize=True, block_size=5, **options
    )
    first = evaluate_embeddings(
        torch.nn.functional.normalize(x, dim=1), None, labels, block_size=5, **options
    )
    assert blockwise == first


def test_normalize_reads_float16_memory_maps_without_writing_them(tmp_path):
    x, labels = _problem(2)
    path = tmp_path / "database.npy"
    np.save(path, x.half().numpy())
    mapped = np.load(path, mmap_mode="r")
    out = evaluate_embeddings(mapped[:9], mapped, labels[:9], labels, normalize=True, block_size=4)
    ref = _cosine_reference(x.half()[:9].float(), x.half().float(), labels[:9], labels, False)
    assert out["map"] == pytest.approx(ref["map"], abs=1e-6)
    assert np.array_equal(np.load(path), x.half().numpy())  # the source is never normalised


@pytest.mark.parametrize(
    "options, message",
    [
        ({"normalize": True, "background": torch.randn(4, 6)}, "normalize with background"),
        ({"score_norm": object()}, "score_norm needs background"),
        ({"protocol_failure": "skip"}, "protocol_failure must be"),
        ({"relevance_fn": lambda q, d: q[:, None] == d, "protocol": True}, "class labels"),
    ],
)
def test_option_combinations_without_meaning_are_refused(options, message):
    x, labels = _problem(3)
    with pytest.raises(ValueError, match=message):
        evaluate_embeddings(x, None, labels, exclude_self=True, **options)
