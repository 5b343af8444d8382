"""``evaluate`` recognises the queries inside a database however it is stored.

A float16 or float64 copy of float32 query embeddings, or a database that holds the
queries as its first or last rows (queries plus appended distractors), counted each
query's own row as a positive (R@1 = 1.0). The references are float64 brute force.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rl_gap.cli import main


def _clusters():
    g = torch.Generator().manual_seed(3)
    labels = torch.arange(12) % 4  # 4 classes x 3
    centres = torch.randn(4, 6, generator=g)
    emb = centres[labels] + 0.9 * torch.randn(12, 6, generator=g)
    extra = torch.randn(5, 6, generator=g)
    return emb.float(), labels, extra.float(), torch.tensor([4, 5, 6, 7, 8])


def _brute(q, d, ql, dl, own=None):
    """(positive pairs, R@1) in float64; ``own[i]``: query i's own database row, dropped."""
    s = q.double() @ d.double().T
    rel = ql[:, None] == dl[None, :]
    if own is not None:
        s[torch.arange(len(q)), own] = -torch.inf
        rel[torch.arange(len(q)), own] = False
    top = s.argmax(1)
    return int(rel.sum()), float(rel[torch.arange(len(q)), top].double().mean())


def _run(tmp_path, q, ql, d, dl, *flags):
    np.save(tmp_path / "q.npy", q)
    np.save(tmp_path / "ql.npy", ql)
    np.save(tmp_path / "d.npy", d)
    np.save(tmp_path / "dl.npy", dl)
    out = tmp_path / "m.json"
    main(["evaluate", "--queries", str(tmp_path / "q.npy"), "--query-labels",
          str(tmp_path / "ql.npy"), "--database", str(tmp_path / "d.npy"),
          "--database-labels", str(tmp_path / "dl.npy"), "--no-ceiling", "--output", str(out),
          *flags])  # fmt: skip
    return json.loads(out.read_text())


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_a_copy_in_another_dtype_is_the_queries(tmp_path, dtype):
    q, ql, _, _ = _clusters()
    with pytest.raises(ValueError, match="holds the same embeddings as --queries"):
        _run(tmp_path, q.numpy(), ql.numpy(), q.numpy().astype(dtype), ql.numpy())
    got = _run(tmp_path, q.numpy(), ql.numpy(), q.numpy().astype(dtype), ql.numpy(),
               "--exclude-self")  # fmt: skip
    pairs, r1 = _brute(q, q, ql, ql, own=torch.arange(12))
    assert got["num_positive_pairs"] == pairs == 12 * 2
    assert got["r@1"] == pytest.approx(r1, abs=1e-9) and r1 < 1.0


@pytest.mark.parametrize("where", ["first", "last"])
def test_a_database_holding_the_queries_as_a_block(tmp_path, where):
    q, ql, extra, el = _clusters()
    parts = [(q, ql), (extra, el)] if where == "first" else [(extra, el), (q, ql)]
    d, dl = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    offset = 0 if where == "first" else 5
    with pytest.raises(ValueError, match=f"as its rows {offset}..{offset + 11}"):
        _run(tmp_path, q.numpy(), ql.numpy(), d.numpy(), dl.numpy())
    got = _run(tmp_path, q.numpy(), ql.numpy(), d.numpy(), dl.numpy(), "--exclude-self")
    pairs, r1 = _brute(q, d, ql, dl, own=torch.arange(12) + offset)
    assert got["num_positive_pairs"] == pairs == 12 * 2
    assert got["r@1"] == pytest.approx(r1, abs=1e-9) and r1 < 1.0
    counted = _run(tmp_path, q.numpy(), ql.numpy(), d.numpy(), dl.numpy(), "--include-self")
    assert counted["num_positive_pairs"] == _brute(q, d, ql, dl)[0] == 12 * 3
    assert counted["r@1"] == 1.0  # each query's own row first


@pytest.mark.parametrize("flag", [[], ["--include-self"]])
def test_without_database_leave_one_out_unless_include_self(tmp_path, flag):
    q, ql, _, _ = _clusters()
    np.save(tmp_path / "q.npy", q.numpy())
    np.save(tmp_path / "ql.npy", ql.numpy())
    out = tmp_path / "m.json"
    main(["evaluate", "--queries", str(tmp_path / "q.npy"), "--query-labels",
          str(tmp_path / "ql.npy"), "--no-ceiling", "--output", str(out), *flag])  # fmt: skip
    got = json.loads(out.read_text())
    own = None if flag else torch.arange(12)
    pairs, r1 = _brute(q, q, ql, ql, own=own)
    assert got["num_positive_pairs"] == pairs == (12 * 3 if flag else 12 * 2)
    assert got["r@1"] == pytest.approx(r1, abs=1e-9)
