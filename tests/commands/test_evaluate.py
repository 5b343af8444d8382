"""``rl-gap evaluate`` from saved embeddings and label files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rl_gap.cli import main
from rl_gap.metrics.functional import evaluate_embeddings


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-3, 4, (30, 5), generator=g).float() / 4
    d = torch.randint(-3, 4, (50, 5), generator=g).float() / 4
    return q, d, torch.randint(0, 8, (30,), generator=g), torch.randint(0, 6, (50,), generator=g)


def test_npy_and_text_labels(tmp_path, capsys):
    q, d, ql, dl = _data()
    np.save(tmp_path / "q.npy", q.numpy())
    np.save(tmp_path / "d.npy", d.numpy())
    names = np.array(["cat", "dog", "eel", "fox", "gnu", "hen", "ibis", "jay"])
    (tmp_path / "ql.txt").write_text("\n".join(names[ql.numpy()]) + "\n")
    (tmp_path / "dl.txt").write_text("\n".join(names[dl.numpy()]) + "\n")
    out = tmp_path / "res" / "metrics.json"
    code = main([
        "evaluate", "--queries", str(tmp_path / "q.npy"), "--database", str(tmp_path / "d.npy"),
        "--query-labels", str(tmp_path / "ql.txt"), "--database-labels", str(tmp_path / "dl.txt"),
        "--block-size", "7", "--protocol", "--output", str(out),
    ])  # fmt: skip
    assert code == 0
    got = json.loads(out.read_text())
    ref = evaluate_embeddings(q, d, ql, dl, protocol=True, block_size=7)
    assert got == pytest.approx(ref, abs=1e-15, nan_ok=True)
    printed = capsys.readouterr().out
    assert "gap" in printed and "r@p90" in printed


def test_pt_dict_leave_one_out(tmp_path):
    q, _, ql, _ = _data(1)
    torch.save({"embeddings": q, "labels": ql}, tmp_path / "all.pt")
    out = tmp_path / "m.json"
    main(
        ["evaluate", "--queries", str(tmp_path / "all.pt"), "--exclude-self", "--output", str(out)]
    )
    ref = evaluate_embeddings(q, q, ql, ql, exclude_self=True)
    assert json.loads(out.read_text()) == pytest.approx(ref, abs=1e-15, nan_ok=True)


def test_missing_file_names_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match="expected .npy"):
        main(["evaluate", "--queries", str(tmp_path / "nope.npy"), "--query-labels", "x.txt"])


def test_label_length_mismatch(tmp_path):
    q, _, ql, _ = _data(2)
    np.save(tmp_path / "q.npy", q.numpy())
    np.save(tmp_path / "ql.npy", ql.numpy()[:-1])
    with pytest.raises(ValueError, match="query_labels"):
        main(
            [
                "evaluate",
                "--queries",
                str(tmp_path / "q.npy"),
                "--query-labels",
                str(tmp_path / "ql.npy"),
                "--exclude-self",
            ]
        )


def _sklearn_gap(scores: np.ndarray, rel: np.ndarray, keep: np.ndarray | None = None) -> float:
    from sklearn.metrics import average_precision_score

    keep = np.ones_like(rel) if keep is None else keep
    return float(average_precision_score(rel[keep], scores[keep]))


def test_float_and_text_numbers_compare_as_numbers(tmp_path):
    q, d, ql, dl = _data(3)
    np.save(tmp_path / "q.npy", q.numpy())
    np.save(tmp_path / "d.npy", d.numpy())
    np.save(tmp_path / "ql.npy", ql.numpy().astype(np.float32))  # 1.0, 2.0, ...
    np.save(tmp_path / "dl.npy", dl.numpy())  # int64
    (tmp_path / "ql.txt").write_text("\n".join(f"{v}.0" for v in ql.tolist()) + "\n")
    rel = (ql[:, None] == dl[None]).numpy()
    ref = _sklearn_gap((q @ d.T).double().numpy(), rel)
    for labels in ("ql.npy", "ql.txt"):
        out = tmp_path / f"{labels}.json"
        code = main([
            "evaluate", "--queries", str(tmp_path / "q.npy"), "--database", str(tmp_path / "d.npy"),
            "--query-labels", str(tmp_path / labels), "--database-labels", str(tmp_path / "dl.npy"),
            "--output", str(out), "--no-ceiling",
        ])  # fmt: skip
        assert code == 0
        assert json.loads(out.read_text())["gap"] == pytest.approx(ref, abs=1e-6), labels


@pytest.mark.parametrize(
    "query_text, database, message",
    [
        ("1\n01\n1\n", "ints", "same number but different text"),
        ("cat\ndog\ncat\n", "ints", "class names but database labels are numbers"),
        ("7\n8\n9\n", "ints", "no query label occurs among the database labels"),
        ("1.5\n2\n2\n", "ints", "integer class ids"),
    ],
)
def test_label_mismatches_are_refused(tmp_path, query_text, database, message):
    g = torch.Generator().manual_seed(4)
    np.save(tmp_path / "q.npy", torch.randn(3, 4, generator=g).numpy())
    np.save(tmp_path / "d.npy", torch.randn(6, 4, generator=g).numpy())
    (tmp_path / "ql.txt").write_text(query_text)
    np.save(tmp_path / "dl.npy", np.array([1, 2, 1, 2, 3, 3]))
    with pytest.raises(ValueError, match=message):
        main([
            "evaluate", "--queries", str(tmp_path / "q.npy"), "--database", str(tmp_path / "d.npy"),
            "--query-labels", str(tmp_path / "ql.txt"), "--database-labels", str(tmp_path / "dl.npy"),
        ])  # fmt: skip


def test_without_database_is_leave_one_out(tmp_path, capsys):
    q, _, ql, _ = _data(5)
    np.save(tmp_path / "q.npy", q.numpy())
    np.save(tmp_path / "ql.npy", ql.numpy())
    out = tmp_path / "m.json"
    code = main([
        "evaluate", "--queries", str(tmp_path / "q.npy"), "--query-labels", str(tmp_path / "ql.npy"),
        "--output", str(out),
    ])  # fmt: skip
    assert code == 0
    assert "leave-one-out" in capsys.readouterr().err
    got = json.loads(out.read_text())
    # brute force, self pairs excluded (a query retrieving itself would give R@1 = 1)
    scores = (q @ q.T).double().numpy()
    rel = (ql[:, None] == ql[None]).numpy()
    keep = ~np.eye(len(ql), dtype=bool)
    hits = []
    for i in range(len(ql)):
        pos, neg = rel[i] & keep[i], ~rel[i]
        if pos.any():
            hits.append(int((scores[i][neg] >= scores[i][pos].max()).sum()) < 1)
    assert got["r@1"] == pytest.approx(np.mean(hits), abs=1e-12) and got["r@1"] < 1
    assert got["gap"] == pytest.approx(_sklearn_gap(scores, rel, keep), abs=1e-6)
    assert got["num_pairs"] == len(ql) * (len(ql) - 1)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--block-size", "0"], "--block-size must be >= 1"),
        (["--bootstrap", "-3"], "--bootstrap must be >= 0"),
        (["--ks", "0"], "ks entry must be >= 1"),
        (["--precision", "0.9", "0.9"], "same metric key"),
    ],
)
def test_bad_options_are_named(tmp_path, extra, message):
    q, _, ql, _ = _data(6)
    np.save(tmp_path / "q.npy", q.numpy())
    np.save(tmp_path / "ql.npy", ql.numpy())
    with pytest.raises(ValueError, match=message):
        main(["evaluate", "--queries", str(tmp_path / "q.npy"), "--query-labels",
              str(tmp_path / "ql.npy"), *extra])  # fmt: skip


def test_empty_queries(tmp_path):
    np.save(tmp_path / "q.npy", np.zeros((0, 4), dtype=np.float32))
    np.save(tmp_path / "d.npy", np.ones((3, 4), dtype=np.float32))
    np.save(tmp_path / "ql.npy", np.zeros(0, dtype=np.int64))
    np.save(tmp_path / "dl.npy", np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="empty"):
        main([
            "evaluate", "--queries", str(tmp_path / "q.npy"), "--database", str(tmp_path / "d.npy"),
            "--query-labels", str(tmp_path / "ql.npy"), "--database-labels", str(tmp_path / "dl.npy"),
        ])  # fmt: skip


def test_leave_one_out_without_any_positive_is_refused(tmp_path):
    # every label once: no query has a positive besides itself -> NaN metrics, refused
    np.save(tmp_path / "q.npy", torch.randn(5, 3).numpy())
    np.save(tmp_path / "ql.npy", np.arange(5))
    with pytest.raises(ValueError, match="other than itself"):
        main(["evaluate", "--queries", str(tmp_path / "q.npy"), "--query-labels",
              str(tmp_path / "ql.npy")])  # fmt: skip


@pytest.mark.parametrize(
    "header, row",
    [
        ("label", "{label}"),
        ("path,label", "img_{i}.jpg,{label}"),
        ("id", "{label}"),
        ("", "{label}"),
    ],
)
def test_label_csv_header_is_not_a_label(tmp_path, header, row):
    """A header row (named label column, or text above numbers) is dropped, never a label."""
    q, d, ql, dl = _data(3)
    np.save(tmp_path / "q.npy", q.numpy())
    np.save(tmp_path / "d.npy", d.numpy())
    for name, labels in (("ql.csv", ql), ("dl.csv", dl)):
        lines = [row.format(i=i, label=int(v)) for i, v in enumerate(labels)]
        (tmp_path / name).write_text("\n".join(([header] if header else []) + lines) + "\n")
    out = tmp_path / "metrics.json"
    code = main([
        "evaluate", "--queries", str(tmp_path / "q.npy"), "--database", str(tmp_path / "d.npy"),
        "--query-labels", str(tmp_path / "ql.csv"), "--database-labels", str(tmp_path / "dl.csv"),
        "--output", str(out),
    ])  # fmt: skip
    assert code == 0
    ref = evaluate_embeddings(q.double(), d.double(), ql, dl)
    got = json.loads(out.read_text())
    assert got["gap"] == pytest.approx(ref["gap"], abs=1e-6)
    assert got["map"] == pytest.approx(ref["map"], abs=1e-6)


def test_label_csv_with_only_a_header_is_refused(tmp_path):
    np.save(tmp_path / "q.npy", np.zeros((2, 3), np.float32))
    (tmp_path / "ql.csv").write_text("path,label\n")
    with pytest.raises((ValueError, SystemExit), match="header but no labels"):
        main(["evaluate", "--queries", str(tmp_path / "q.npy"),
              "--query-labels", str(tmp_path / "ql.csv")])  # fmt: skip


def _clusters(n_classes, per_class, seed=0):
    """Well separated classes: every metric is 1 when the labels pair up correctly."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(n_classes), per_class)
    emb = np.eye(n_classes)[labels] + 0.05 * rng.normal(size=(len(labels), n_classes))
    return emb.astype(np.float32), labels


def test_64bit_text_ids_against_int64_npy_ids(tmp_path):
    """The issue's case: ids 2**60 + k in a query .txt, the same ids in an int64 database
    .npy (float64 turned 2**60 and 2**60 + 1 into one class: gAP 0.29, R@1 0)."""
    q, q_cls = _clusters(4, 2, seed=1)
    d, d_cls = _clusters(4, 3, seed=2)
    ids = np.array([2**60, 2**60 + 1, 2**60 + 2, 2**61 + 1], dtype=np.int64)
    np.save(tmp_path / "q.npy", q)
    np.save(tmp_path / "d.npy", d)
    (tmp_path / "ql.txt").write_text("\n".join(str(int(v)) for v in ids[q_cls]) + "\n")
    np.save(tmp_path / "dl.npy", ids[d_cls])
    out = tmp_path / "m.json"
    assert main([
        "evaluate", "--queries", str(tmp_path / "q.npy"), "--database", str(tmp_path / "d.npy"),
        "--query-labels", str(tmp_path / "ql.txt"), "--database-labels", str(tmp_path / "dl.npy"),
        "--no-ceiling", "--output", str(out),
    ]) == 0  # fmt: skip
    got = json.loads(out.read_text())
    assert got["num_positive_pairs"] == 8 * 3  # each query: its class's 3 database items
    assert got["gap"] == got["map"] == got["r@1"] == 1.0


def test_database_holding_the_queries_needs_exclude_or_include_self(tmp_path):
    """The issue's case: --database <the query file> without --exclude-self counted self
    pairs silently (R@1 0.964 vs 0.884 leave-one-out)."""
    emb, labels = _data(4)[0].numpy(), _data(4)[2].numpy()
    np.save(tmp_path / "e.npy", emb)
    np.save(tmp_path / "copy.npy", emb.copy())
    np.save(tmp_path / "l.npy", labels)
    common = ["evaluate", "--queries", str(tmp_path / "e.npy"), "--query-labels",
              str(tmp_path / "l.npy"), "--database-labels", str(tmp_path / "l.npy"),
              "--no-ceiling"]  # fmt: skip
    torch.save(torch.from_numpy(emb.copy()), tmp_path / "copy.pt")
    for database in ("e.npy", "copy.npy", "copy.pt"):  # the same path, or the same content
        with pytest.raises(ValueError, match=r"same embeddings as --queries .*--exclude-self"):
            main([*common, "--database", str(tmp_path / database)])
    t, lab = torch.from_numpy(emb).double(), torch.from_numpy(labels)
    for flag, exclude in (("--exclude-self", True), ("--include-self", False)):
        out = tmp_path / f"{flag}.json"
        main([*common, "--database", str(tmp_path / "copy.npy"), flag, "--output", str(out)])
        ref = evaluate_embeddings(t, t, lab, lab, exclude_self=exclude, ceiling=False)
        got = json.loads(out.read_text())
        assert got["num_positive_pairs"] == ref["num_positive_pairs"]
        assert got["gap"] == pytest.approx(ref["gap"], abs=1e-6)
        assert got["r@1"] == pytest.approx(ref["r@1"], abs=1e-6)
    # a different database of the same shape is neither
    np.save(tmp_path / "other.npy", emb[::-1].copy())
    with pytest.raises(ValueError, match="--include-self counts pair"):
        main([*common, "--database", str(tmp_path / "other.npy"), "--include-self"])


def test_object_label_npy_is_named_for_what_it_is(tmp_path):
    np.save(tmp_path / "e.npy", np.eye(3, dtype=np.float32))
    np.save(tmp_path / "l.npy", np.array(["a", 1, 2], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match=r"array of Python objects") as info:
        main(["evaluate", "--queries", str(tmp_path / "e.npy"),
              "--query-labels", str(tmp_path / "l.npy")])  # fmt: skip
    assert "truncated" not in str(info.value)


def test_a_name_above_numeric_labels_is_kept_when_rows_match_the_embeddings(tmp_path, capsys):
    """A first label that is a class name is a label, not a header, when the file holds one
    row per embedding (it was dropped silently, every label then one row off)."""
    emb, cls = _clusters(3, 3)
    names = np.array(["7", "8", "9"])[cls]
    names[0] = "unknown"  # a name at the top of a file of numbers
    np.save(tmp_path / "e.npy", emb)
    (tmp_path / "l.txt").write_text("\n".join(names) + "\n")
    out = tmp_path / "m.json"
    assert main(["evaluate", "--queries", str(tmp_path / "e.npy"), "--query-labels",
                 str(tmp_path / "l.txt"), "--no-ceiling", "--output", str(out)]) == 0  # fmt: skip
    codes = np.unique(names, return_inverse=True)[1]
    ref = evaluate_embeddings(torch.from_numpy(emb).double(), query_labels=torch.from_numpy(codes),
                              exclude_self=True, ceiling=False)  # fmt: skip
    got = json.loads(out.read_text())
    assert got["num_positive_pairs"] == ref["num_positive_pairs"] == 2 + 6 + 6
    assert got["map"] == pytest.approx(ref["map"], abs=1e-6)
    assert "header" not in capsys.readouterr().err


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_normalize_matches_normalising_the_files_first(tmp_path, leave_one_out):
    """``--normalize`` L2-normalises block by block inside the engine: the metrics equal
    those of files normalised beforehand, and cosine float64 brute force."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(12, 4, generator=g) * torch.linspace(0.1, 10, 12)[:, None]
    d = torch.randn(40, 4, generator=g) * torch.linspace(10, 0.1, 40)[:, None]
    ql, dl = torch.randint(0, 4, (12,), generator=g), torch.randint(0, 4, (40,), generator=g)
    if leave_one_out:
        q, ql = d, dl
    files = {"q": q, "d": d, "qn": torch.nn.functional.normalize(q, dim=1)}
    files["dn"] = torch.nn.functional.normalize(d, dim=1)
    for name, x in files.items():
        np.save(tmp_path / f"{name}.npy", x.numpy())
    np.save(tmp_path / "ql.npy", ql.numpy())
    np.save(tmp_path / "dl.npy", dl.numpy())

    def evaluate(queries: str, database: str, *extra: str) -> dict:
        out = tmp_path / f"{queries}{len(extra)}.json"
        args = ["evaluate", "--queries", str(tmp_path / f"{queries}.npy"), "--query-labels",
                str(tmp_path / "ql.npy"), "--block-size", "8", "--no-ceiling", "--output", str(out)]  # fmt: skip
        if not leave_one_out:
            args += ["--database", str(tmp_path / f"{database}.npy")]
            args += ["--database-labels", str(tmp_path / "dl.npy")]
        assert main(args + list(extra)) == 0
        return json.loads(out.read_text())

    cosine = evaluate("q", "d", "--normalize")
    assert cosine == evaluate("qn", "dn")
    assert cosine["map"] != pytest.approx(evaluate("q", "d")["map"], abs=1e-3)
    qd, dd = (torch.nn.functional.normalize(x.double(), dim=1) for x in (q, d))
    scores, rel = qd @ dd.T, ql[:, None] == dl[None, :]
    aps = []
    for i in range(len(ql)):
        keep = torch.arange(len(dl)) != i if leave_one_out else torch.ones(len(dl), dtype=bool)
        s, r = scores[i][keep], rel[i][keep]
        if r.any():  # AP: mean precision at each positive's rank (no ties in float64 here)
            ranks = (s[None, :] >= s[r][:, None]).sum(1).double()
            aps.append(float((torch.arange(1, int(r.sum()) + 1) / ranks.sort().values).mean()))
    assert cosine["map"] == pytest.approx(np.mean(aps), abs=1e-6)


def test_map_at_r_in_the_output_and_progress_only_on_stderr(tmp_path, capsys):
    from tests.metrics.functional.test_map_at_r import brute_force

    q, d, ql, dl = _data(3)  # dyadic: exact, tied scores
    np.save(tmp_path / "q.npy", q.numpy())
    np.save(tmp_path / "d.npy", d.numpy())
    np.save(tmp_path / "ql.npy", ql.numpy())
    np.save(tmp_path / "dl.npy", dl.numpy())
    out = tmp_path / "metrics.json"
    argv = ["evaluate", "--queries", str(tmp_path / "q.npy"), "--database", str(tmp_path / "d.npy"),
            "--query-labels", str(tmp_path / "ql.npy"), "--database-labels",
            str(tmp_path / "dl.npy"), "--block-size", "8", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    got = json.loads(out.read_text())
    scores = (q.double() @ d.double().T).numpy()
    want_map, want_rp, _ = brute_force(scores, (ql[:, None] == dl[None, :]).numpy())
    assert got["map@r"] == pytest.approx(want_map, abs=1e-12)
    assert got["r_precision"] == pytest.approx(want_rp, abs=1e-12)
    shown = capsys.readouterr()
    assert "map@r" in shown.out and "engine pass 1: blocks" in shown.err
    assert "blocks" not in shown.out  # the bar never mixes into the printed table
    assert main([*argv, "--quiet"]) == 0
    assert "blocks" not in capsys.readouterr().err
