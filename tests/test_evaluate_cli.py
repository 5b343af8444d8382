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
