"""``rl-gap extrapolate`` takes the score range from the embeddings it scores (their norms)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rl_gap.cli import main


def _write(tmp_path, scale_q=1.0, scale_x=1.0, S=3000, Q=6, d=8, seed=0):
    rng = np.random.default_rng(seed)

    def unit(a):
        return (a / np.linalg.norm(a, axis=1, keepdims=True)).astype(np.float32)

    q = unit(rng.normal(size=(Q, d)))
    p = unit(q[np.arange(Q).repeat(2)] + 0.4 * rng.normal(size=(2 * Q, d)))
    x = unit(rng.normal(size=(S, d)))
    # Norms below 1 keep every inner product inside [-1, 1]: a range check alone reads cosine.
    np.save(tmp_path / "q.npy", q * scale_q)
    np.save(tmp_path / "p.npy", p * scale_q)
    np.save(tmp_path / "x.npy", x * scale_x)
    np.save(tmp_path / "owner.npy", np.arange(Q).repeat(2))


def _run(tmp_path, *extra):
    out = tmp_path / "res.json"
    rc = main([
        "extrapolate", "--queries", str(tmp_path / "q.npy"), "--positives", str(tmp_path / "p.npy"),
        "--positive-query", str(tmp_path / "owner.npy"), "--distractors", str(tmp_path / "x.npy"),
        "--gallery-size", "30000", "--k", "20", "--n-boot", "0", "--estimators", "count",
        "--no-progress", "--format", "json", "--json", str(out), *extra,
    ])  # fmt: skip
    assert rc == 0
    return json.loads(out.read_text())


def test_unit_embeddings_are_read_as_cosine(tmp_path):
    _write(tmp_path)
    res = _run(tmp_path)
    assert res["score_range"] == [-1.0, 1.0]
    assert res["embedding_norms"][0] == pytest.approx(1.0, abs=1e-5)
    assert res["embedding_norms"][1] == pytest.approx(1.0, abs=1e-5)


def test_inner_products_inside_minus_one_one_are_not_read_as_cosine(tmp_path):
    _write(tmp_path, scale_q=0.9, scale_x=0.6)
    res = _run(tmp_path)
    assert res["score_range"] is None  # unbounded inner products
    assert res["embedding_norms"] == pytest.approx([0.6, 0.9], abs=1e-5)
    # --l2-normalize makes them cosine again.
    assert _run(tmp_path, "--l2-normalize")["score_range"] == [-1.0, 1.0]


def test_explicit_cosine_on_non_unit_embeddings_is_refused(tmp_path, capsys):
    _write(tmp_path, scale_x=0.6)
    with pytest.raises((SystemExit, ValueError)) as err:
        _run(tmp_path, "--similarity", "cosine")
    message = str(err.value) + capsys.readouterr().err
    assert "--similarity cosine" in message and "not 1" in message
    # An explicit range is the user's declaration and is kept as given.
    assert _run(tmp_path, "--score-range=-2,2")["score_range"] == [-2.0, 2.0]
