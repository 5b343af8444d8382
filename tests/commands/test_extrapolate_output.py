"""``rl-gap extrapolate``: output formats, defaults in --help, labels, k capping, top-k positives."""

from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest
import torch

from rl_gap.cli import main
from rl_gap.commands.extrapolate_inputs import top_positive_scores
from rl_gap.metrics.tail import predict_map


def _inputs(tmp_path, Q=12, per=3, S=3000, d=10, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(Q // per, d))
    labels = np.repeat(np.arange(Q // per), per)
    emb = (centres[labels] + 0.4 * rng.normal(size=(Q, d))).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    x = rng.normal(size=(S, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    np.save(tmp_path / "e.npy", emb)
    np.save(tmp_path / "x.npy", x)
    return emb, labels, x


def _args(tmp_path, *extra):
    return ["extrapolate", "--queries", str(tmp_path / "e.npy"), "--positives",
            str(tmp_path / "e.npy"), "--query-labels", str(tmp_path / "l.npy"),
            "--positive-labels", str(tmp_path / "l.npy"), "--distractors",
            str(tmp_path / "x.npy"), "--gallery-size", "30000", "--k", "20", "--n-boot", "20",
            "--no-progress", "--estimators", "count,evt_support", *extra]  # fmt: skip


def test_string_labels_give_the_same_result_as_integer_labels(tmp_path, capsys):
    emb, labels, x = _inputs(tmp_path)
    np.save(tmp_path / "l.npy", labels)
    assert main(_args(tmp_path, "--format", "json")) == 0
    as_int = json.loads(capsys.readouterr().out)
    np.save(tmp_path / "l.npy", np.array([f"class-{v}" for v in labels]))
    assert main(_args(tmp_path, "--format", "json")) == 0
    as_text = json.loads(capsys.readouterr().out)
    assert as_text["estimators"]["count"]["map"] == as_int["estimators"]["count"]["map"]
    # Reference: leave-one-out positives by brute force, the functional API.
    pos = torch.tensor(
        [[float(emb[i] @ emb[j]) for j in range(len(labels)) if labels[j] == labels[i] and j != i]
         for i in range(len(labels))], dtype=torch.float64)  # fmt: skip
    ref = predict_map(pos, torch.from_numpy(emb @ x.T), 30_000, k=20, estimator="count", n_boot=20)
    assert as_text["estimators"]["count"]["map"] == pytest.approx(ref.map, abs=1e-6)


def test_csv_and_table_formats(tmp_path, capsys):
    _inputs(tmp_path)
    np.save(tmp_path / "l.npy", np.repeat(np.arange(4), 3))
    assert main(_args(tmp_path, "--format", "csv")) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["estimator"] for r in rows] == ["count", "evt_support"]
    assert float(rows[0]["ci_low"]) <= float(rows[0]["map"]) <= float(rows[0]["ci_high"])
    assert main(_args(tmp_path)) == 0
    printed = capsys.readouterr().out
    assert "evt_support" in printed and "95% CI" in printed
    assert max(len(line) for line in printed.splitlines()) <= 100
    assert "…" not in printed  # no cell cut short


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["extrapolate", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "(default: 1000)" in text and "(default: tail_pooled)" in text
    assert "(default: auto)" in text


def test_k_beyond_the_gallery_is_capped_not_allocated(tmp_path, capsys):
    _inputs(tmp_path)
    np.save(tmp_path / "l.npy", np.repeat(np.arange(4), 3))
    args = _args(tmp_path, "--format", "json")
    args[args.index("--k") + 1] = "10000000"
    assert main(args) == 0
    captured = capsys.readouterr()
    res = json.loads(captured.out)
    assert res["k"] == 30_000 + 12 and "exceeds the gallery" in captured.err
    # The cap is part of the results, not only a note on stderr.
    assert res["requested_k"] == 10_000_000
    assert res["flags"] == [
        "--k 10,000,000 exceeds the gallery's length (N + positives = 30,012); "
        "using k = 30,012 (the same metric)"
    ]
    # AP past the gallery's length is AP: the same as any k >= N + positives.
    args[args.index("--k") + 1] = str(30_012)
    assert main(args) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["estimators"]["count"]["map"] == res["estimators"]["count"]["map"]
    assert same["flags"] == [] and same["requested_k"] == 30_012


@pytest.mark.parametrize("sides", ["both", "query", "positive"])
def test_text_labels_are_read_as_evaluate_reads_them(tmp_path, capsys, sides):
    """.txt labels (one per line, optional header) give the result of the same ids in a .npy,
    also when only one side is text."""
    _inputs(tmp_path)
    labels = np.repeat(np.arange(4), 3)
    np.save(tmp_path / "l.npy", labels)
    assert main(_args(tmp_path, "--format", "json")) == 0
    reference = json.loads(capsys.readouterr().out)["estimators"]["count"]["map"]
    (tmp_path / "l.txt").write_text("label\n" + "\n".join(str(v) for v in labels) + "\n")
    args = _args(tmp_path, "--format", "json")
    for option, side in (("--query-labels", "query"), ("--positive-labels", "positive")):
        if sides in ("both", side):
            args[args.index(option) + 1] = str(tmp_path / "l.txt")
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["estimators"]["count"]["map"] == reference
    (tmp_path / "short.txt").write_text("\n".join(str(v) for v in labels[:5]))
    args[args.index("--query-labels") + 1] = str(tmp_path / "short.txt")
    with pytest.raises(ValueError, match=r"labels must be \(12,\)"):
        main(args)


def test_distractors_that_are_the_queries_are_refused(tmp_path):
    emb, labels, x = _inputs(tmp_path)
    np.save(tmp_path / "l.npy", labels)
    folder = tmp_path / "pred"
    folder.mkdir()
    np.save(folder / "embeddings.npy", emb)
    np.save(folder / "labels.npy", labels)
    args = _args(tmp_path)
    for queries, distractors in ((folder, folder), (folder, folder / "embeddings.npy"),
                                 (tmp_path / "e.npy", tmp_path / "e.npy")):  # fmt: skip
        args[args.index("--queries") + 1] = args[args.index("--positives") + 1] = str(queries)
        args[args.index("--distractors") + 1] = str(distractors)
        with pytest.raises(ValueError, match="--distractors .* is the --queries set"):
            main(args)


def test_top_k_positives_per_query_give_the_full_ap_at_k():
    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(30, 6, generator=g), dim=1)
    p = torch.nn.functional.normalize(torch.randn(200, 6, generator=g), dim=1)
    codes = torch.randint(0, 3, (30,), generator=g)
    pcodes = torch.randint(0, 3, (200,), generator=g)
    full = top_positive_scores(q, p, 10_000, query_codes=codes, positive_codes=pcodes)
    cut = top_positive_scores(q, p, 5, query_codes=codes, positive_codes=pcodes)
    assert cut.shape[1] == 5 and full.shape[1] > 5
    # Brute force: each query's positives, sorted, the top 5.
    for i in range(30):
        mine = (
            (q[i : i + 1].double() @ p[pcodes == codes[i]].double().T).ravel().sort(descending=True)
        )
        assert torch.allclose(cut[i], mine.values[:5])
    sample = torch.randn(30, 500, generator=g, dtype=torch.float64) * 0.3
    a = predict_map(full, sample, 5000, k=5, estimator="count", n_boot=0).map
    b = predict_map(cut, sample, 5000, k=5, estimator="count", n_boot=0).map
    assert a == pytest.approx(b, abs=1e-12)
    owner = torch.randint(0, 30, (200,), generator=g)
    by_owner = top_positive_scores(q, p, 3, owner=owner)
    for i in range(30):
        mine = (q[i].double() * p[owner == i].double()).sum(1).sort(descending=True).values[:3]
        got = by_owner[i][~torch.isnan(by_owner[i])]
        assert torch.allclose(got, mine)
    assert not math.isnan(float(by_owner[~torch.isnan(by_owner)].sum()))
