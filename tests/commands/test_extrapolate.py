"""``rl-gap extrapolate`` end to end on small saved embeddings."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from rl_gap.cli import main
from rl_gap.metrics.tail import predict_map
from rl_gap.metrics.tail.bayes import BayesTailConfig


def write_inputs(tmp_path, Q=10, P=25, S=6000, d=12, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(Q, d)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    owner = rng.integers(0, Q - 1, size=P)  # the last query has no positive
    p = q[owner] + 0.5 * rng.normal(size=(P, d)).astype(np.float32)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    x = rng.normal(size=(S, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    np.save(tmp_path / "q.npy", q)
    torch.save(torch.from_numpy(p), tmp_path / "p.pt")
    np.save(tmp_path / "owner.npy", owner)
    np.save(tmp_path / "x.npy", x)
    return q, p, owner, x


def test_extrapolate_cli_table_json_and_plot(tmp_path, capsys):
    q, p, owner, x = write_inputs(tmp_path)
    out_json, out_png = tmp_path / "res.json", tmp_path / "curve.png"
    rc = main([
        "extrapolate", "--queries", str(tmp_path / "q.npy"), "--positives", str(tmp_path / "p.pt"),
        "--positive-query", str(tmp_path / "owner.npy"), "--distractors", str(tmp_path / "x.npy"),
        "--gallery-size", "120000", "--k", "100", "--n-boot", "200", "--json", str(out_json),
        "--plot", str(out_png), "--block-size", "1000", "--no-progress",
        "--estimators", "sample,count,evt",
    ])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "evt" in printed and "count" in printed and "95% CI" in printed
    res = json.loads(out_json.read_text())
    n_empty = q.shape[0] - len(np.unique(owner))
    assert (
        res["sample_size"] == 6000
        and res["n_excluded"] == n_empty
        and res["n_queries"] == q.shape[0] - n_empty
    )
    # Reference: plain positive scores, full score matrix, the functional API.
    Q = q.shape[0]
    rows = [[float(q[i] @ p[j]) for j in range(len(owner)) if owner[j] == i] for i in range(Q)]
    m = max(len(r) for r in rows)
    pos = torch.tensor([r + [math.nan] * (m - len(r)) for r in rows], dtype=torch.float64)
    sample = torch.from_numpy(q @ x.T)
    for name in ("sample", "count", "evt"):
        ref = predict_map(pos, sample, gallery_size=120_000, k=100, estimator=name, n_boot=200)
        assert res["estimators"][name]["map"] == pytest.approx(ref.map, abs=1e-5)
    assert res["estimators"]["evt"]["budget"]["levels"][-1]["sample_size"] == 6000
    assert [m["sample_size"] for m in res["measured"]] == [750, 1500, 3000, 6000]
    assert out_png.stat().st_size > 10_000
    curves = res["plot"]["curves"]
    assert curves["evt"]["map"][0] >= curves["evt"]["map"][-1]  # mAP never rises with N


def test_json_is_written_only_when_asked_for(tmp_path, monkeypatch, capsys):
    inputs, work = tmp_path / "inputs", tmp_path / "work"
    inputs.mkdir()
    work.mkdir()
    q, p, owner, x = write_inputs(inputs, S=2000)
    monkeypatch.chdir(work)
    args = ["extrapolate", "--queries", str(inputs / "q.npy"), "--positives", str(inputs / "p.pt"),
            "--positive-query", str(inputs / "owner.npy"), "--distractors", str(inputs / "x.npy"),
            "--gallery-size", "20000", "--k", "50", "--n-boot", "20", "--estimators", "count",
            "--no-progress"]  # fmt: skip
    assert main(args) == 0
    assert "95% CI" in capsys.readouterr().out  # the table is always printed
    assert sorted(work.iterdir()) == []  # and nothing is dropped into the working folder
    assert main([*args, "--json", "res.json"]) == 0
    assert "results written to res.json" in capsys.readouterr().out
    assert sorted(f.name for f in work.iterdir()) == ["res.json"]
    res = json.loads((work / "res.json").read_text())
    rows = [[float(q[i] @ p[j]) for j in range(len(owner)) if owner[j] == i] for i in range(len(q))]
    m = max(len(r) for r in rows)
    pos = torch.tensor([r + [math.nan] * (m - len(r)) for r in rows], dtype=torch.float64)
    ref = predict_map(
        pos, torch.from_numpy(q @ x.T), gallery_size=20_000, k=50, estimator="count", n_boot=20
    )
    assert res["sample_size"] == 2000
    assert res["estimators"]["count"]["map"] == pytest.approx(ref.map, abs=1e-5)


def test_extrapolate_cli_labels_and_errors(tmp_path):
    q, p, owner, x = write_inputs(tmp_path, seed=1)
    np.save(tmp_path / "ql.npy", np.arange(q.shape[0]))
    np.save(tmp_path / "pl.npy", owner)
    base = ["extrapolate", "--queries", str(tmp_path / "q.npy"), "--positives", str(tmp_path / "p.pt"),
            "--distractors", str(tmp_path / "x.npy"), "--k", "50", "--n-boot", "50", "--no-progress",
            "--estimators", "count"]  # fmt: skip
    labels = [
        "--query-labels",
        str(tmp_path / "ql.npy"),
        "--positive-labels",
        str(tmp_path / "pl.npy"),
    ]
    assert (
        main([*base, *labels, "--gallery-size", "60000", "--json", str(tmp_path / "a.json")]) == 0
    )
    owner_args = ["--positive-query", str(tmp_path / "owner.npy")]
    assert (
        main([*base, *owner_args, "--gallery-size", "60000", "--json", str(tmp_path / "b.json")])
        == 0
    )
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert a["estimators"]["count"]["map"] == pytest.approx(
        b["estimators"]["count"]["map"], abs=1e-12
    )
    with pytest.raises(FileNotFoundError, match="expected"):
        main(
            [
                *base,
                *owner_args,
                "--gallery-size",
                "60000",
                "--distractors",
                str(tmp_path / "nope.npy"),
            ]
        )
    with pytest.raises(ValueError, match="gallery-size"):
        main([*base, *owner_args, "--gallery-size", "10", "--json", ""])
    with pytest.raises(ValueError, match="tie positives"):
        main([*base, "--gallery-size", "60000", "--json", ""])
    np.save(tmp_path / "bad.npy", np.zeros((100, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="dimension"):
        main(
            [
                *base,
                *owner_args,
                "--gallery-size",
                "60000",
                "--distractors",
                str(tmp_path / "bad.npy"),
            ]
        )


def test_extrapolate_reads_prediction_writer_folders(tmp_path):
    """Folders with embeddings.npy + labels.npy (the prediction writer's output) tie positives
    by label; the result equals the labels-file route."""
    q, p, owner, x = write_inputs(tmp_path, seed=2)
    for name, emb, lab in (("queries", q, np.arange(q.shape[0])), ("positives", p, owner)):
        (tmp_path / name).mkdir()
        np.save(tmp_path / name / "embeddings.npy", emb.astype(np.float32))
        np.save(tmp_path / name / "labels.npy", lab.astype(np.int64))
    (tmp_path / "sample").mkdir()
    np.save(tmp_path / "sample" / "embeddings.npy", x)
    np.save(tmp_path / "sample" / "labels.npy", np.zeros(len(x), dtype=np.int64))
    common = ["--gallery-size", "60000", "--k", "50", "--n-boot", "50", "--no-progress",
              "--estimators", "count,tail"]  # fmt: skip
    rc = main([
        "extrapolate", "--queries", str(tmp_path / "queries"), "--positives",
        str(tmp_path / "positives"), "--distractors", str(tmp_path / "sample"), *common,
        "--json", str(tmp_path / "folders.json"),
    ])  # fmt: skip
    assert rc == 0
    res = json.loads((tmp_path / "folders.json").read_text())
    Q = q.shape[0]
    rows = [[float(q[i] @ p[j]) for j in range(len(owner)) if owner[j] == i] for i in range(Q)]
    m = max(len(r) for r in rows)
    pos = torch.tensor([r + [math.nan] * (m - len(r)) for r in rows], dtype=torch.float64)
    for name in ("count", "tail"):
        ref = predict_map(pos, torch.from_numpy(q @ x.T), 60_000, k=50, estimator=name, n_boot=50)
        assert res["estimators"][name]["map"] == pytest.approx(ref.map, abs=1e-5)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="embeddings.npy"):
        main(["extrapolate", "--queries", str(tmp_path / "empty"), "--positives",
              str(tmp_path / "positives"), "--distractors", str(tmp_path / "sample"), *common])  # fmt: skip


def test_positive_query_floats_are_rejected_not_truncated(tmp_path):
    q, p, owner, x = write_inputs(tmp_path, seed=3)
    base = ["extrapolate", "--queries", str(tmp_path / "q.npy"), "--positives", str(tmp_path / "p.pt"),
            "--distractors", str(tmp_path / "x.npy"), "--gallery-size", "60000", "--k", "50",
            "--n-boot", "20", "--no-progress", "--estimators", "count"]  # fmt: skip
    np.save(tmp_path / "frac.npy", owner.astype(np.float64) + 0.5)
    with pytest.raises(ValueError, match="non-integer"):
        main([*base, "--positive-query", str(tmp_path / "frac.npy"), "--json", ""])
    # Integral floats (e.g. a label column saved as float) are exact indices: accepted, same result.
    np.save(tmp_path / "whole.npy", owner.astype(np.float64))
    main(
        [*base, "--positive-query", str(tmp_path / "whole.npy"), "--json", str(tmp_path / "f.json")]
    )
    main(
        [*base, "--positive-query", str(tmp_path / "owner.npy"), "--json", str(tmp_path / "i.json")]
    )
    f, i = (json.loads((tmp_path / n).read_text()) for n in ("f.json", "i.json"))
    assert f["estimators"]["count"]["map"] == i["estimators"]["count"]["map"]


def test_bad_plot_extension_fails_before_work_and_results_survive_a_plot_error(
    tmp_path, monkeypatch
):
    q, p, owner, x = write_inputs(tmp_path, seed=4)
    out = tmp_path / "res.json"
    base = ["extrapolate", "--queries", str(tmp_path / "q.npy"), "--positives", str(tmp_path / "p.pt"),
            "--positive-query", str(tmp_path / "owner.npy"), "--distractors", str(tmp_path / "x.npy"),
            "--gallery-size", "60000", "--k", "50", "--n-boot", "20", "--no-progress",
            "--estimators", "count", "--json", str(out)]  # fmt: skip
    with pytest.raises(ValueError, match="unsupported image extension 'xyz'"):
        main([*base, "--plot", str(tmp_path / "curve.xyz")])
    assert not out.exists()  # refused before any scoring

    import rl_gap.metrics.tail.plot as tail_plot

    def broken(*args, **kwargs):
        raise RuntimeError("renderer failed")

    monkeypatch.setattr(tail_plot, "plot_extrapolation", broken)
    with pytest.raises(RuntimeError, match="renderer failed"):
        main([*base, "--plot", str(tmp_path / "curve.png")])
    assert json.loads(out.read_text())["estimators"]["count"]["map"] > 0


def test_same_folder_for_queries_and_positives_is_leave_one_out(tmp_path):
    rng = np.random.default_rng(5)
    labels = np.repeat(np.arange(6), 3)  # 6 classes x 3 items
    centers = rng.normal(size=(6, 8))
    emb = (centers[labels] + 0.3 * rng.normal(size=(len(labels), 8))).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    x = rng.normal(size=(3000, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    (tmp_path / "set").mkdir()
    np.save(tmp_path / "set" / "embeddings.npy", emb)
    np.save(tmp_path / "set" / "labels.npy", labels)
    np.save(tmp_path / "x.npy", x)
    main(["extrapolate", "--queries", str(tmp_path / "set"), "--positives", str(tmp_path / "set"),
          "--distractors", str(tmp_path / "x.npy"), "--gallery-size", "30000", "--k", "20",
          "--n-boot", "20", "--no-progress", "--estimators", "count",
          "--json", str(tmp_path / "r.json")])  # fmt: skip
    res = json.loads((tmp_path / "r.json").read_text())
    # Reference: each item's positives are the other two items of its class.
    pos = torch.tensor(
        [[float(emb[i] @ emb[j]) for j in range(len(labels)) if labels[j] == labels[i] and j != i]
         for i in range(len(labels))],
        dtype=torch.float64,
    )  # fmt: skip
    ref = predict_map(pos, torch.from_numpy(emb @ x.T), 30_000, k=20, estimator="count", n_boot=20)
    assert 0.05 < ref.map < 0.95  # neither trivial nor zero: a self-match would change it
    assert res["estimators"]["count"]["map"] == pytest.approx(ref.map, abs=1e-6)


def test_bias_replicates_option_reaches_the_tail_estimator(tmp_path):
    q, p, owner, x = write_inputs(tmp_path, S=3000)
    Q = q.shape[0]
    rows = [[float(q[i] @ p[j]) for j in range(len(owner)) if owner[j] == i] for i in range(Q)]
    m = max(len(r) for r in rows)
    pos = torch.tensor([r + [math.nan] * (m - len(r)) for r in rows], dtype=torch.float64)
    sample = torch.from_numpy(q @ x.T)
    common = [
        "extrapolate", "--queries", str(tmp_path / "q.npy"), "--positives", str(tmp_path / "p.pt"),
        "--positive-query", str(tmp_path / "owner.npy"), "--distractors", str(tmp_path / "x.npy"),
        "--gallery-size", "60000", "--k", "100", "--n-boot", "20", "--estimators", "tail",
        "--no-progress",
    ]  # fmt: skip
    maps = {}
    for replicates in (0, 8):
        out = tmp_path / f"r{replicates}.json"
        assert main([*common, "--bias-replicates", str(replicates), "--json", str(out)]) == 0
        maps[replicates] = json.loads(out.read_text())["estimators"]["tail"]["map"]
        ref = predict_map(
            pos, sample, gallery_size=60_000, k=100, n_boot=20, estimator="tail",
            bayes=BayesTailConfig(bias_replicates=replicates),
        )  # fmt: skip
        assert maps[replicates] == pytest.approx(ref.map, abs=1e-5)
    assert maps[0] != pytest.approx(maps[8], abs=1e-6)
    with pytest.raises(ValueError, match="--bias-replicates"):
        main([*common, "--bias-replicates", "-1"])


def test_nested_bootstrap_resamples_each_distractor_once_for_all_queries(tmp_path, capsys):
    """With --nested-boot the CLI keys its state by distractor row, so its joint
    interval equals the functional API's on the same score matrix (column j =
    row j), where every query shares one multiplicity per distractor."""
    q, p, owner, x = write_inputs(tmp_path, S=3000)
    Q = q.shape[0]
    rows = [[float(q[i] @ p[j]) for j in range(len(owner)) if owner[j] == i] for i in range(Q)]
    m = max(len(r) for r in rows)
    pos = torch.tensor([r + [math.nan] * (m - len(r)) for r in rows], dtype=torch.float64)
    out = tmp_path / "nested.json"
    assert main([
        "extrapolate", "--queries", str(tmp_path / "q.npy"), "--positives", str(tmp_path / "p.pt"),
        "--positive-query", str(tmp_path / "owner.npy"), "--distractors", str(tmp_path / "x.npy"),
        "--gallery-size", "60000", "--k", "100", "--n-boot", "20", "--estimators", "count",
        "--nested-boot", "12", "--no-progress", "--json", str(out),
    ]) == 0  # fmt: skip
    assert "joint CI" in capsys.readouterr().out
    got = json.loads(out.read_text())["estimators"]["count"]
    ref = predict_map(
        pos, torch.from_numpy(q @ x.T), 60_000, 100, "count", n_boot=20, nested_boot=12
    )
    assert got["sample_noise_sd"] == pytest.approx(ref.sample_noise_sd, rel=1e-6)
    assert got["nested_ci"] == pytest.approx(list(ref.nested_ci), rel=1e-6)
