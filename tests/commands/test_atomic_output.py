"""Result files replaced whole or not at all (``evaluate --output``, ``extrapolate --json``)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import stat

import numpy as np
import pytest

from rl_gap.cli import main
from rl_gap.commands.atomic_output import write_text_atomic

OLD = json.dumps({"gap": 0.5, "note": "x" * 200})


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """Writes past ``nbytes`` fail with EFBIG, as on a full disk (RLIMIT_FSIZE, this process)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial"))


def test_replaces_the_file_and_keeps_its_permissions(tmp_path):
    target = tmp_path / "out.json"
    target.write_text(OLD)
    os.chmod(target, 0o640)
    write_text_atomic(target, '{"gap": 1.0}')
    assert json.loads(target.read_text()) == {"gap": 1.0}
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert _leftovers(tmp_path) == []


def test_new_file_follows_the_umask_and_parents_are_made(tmp_path):
    old = os.umask(0o022)
    try:
        path = write_text_atomic(tmp_path / "a" / "b" / "new.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's 0600


def test_failed_write_keeps_the_previous_file(tmp_path):
    target = tmp_path / "out.json"
    target.write_text(OLD)
    with file_size_limit(64), pytest.raises(OSError, match="the previous file is intact"):
        write_text_atomic(target, json.dumps({"gap": 1.0, "pad": "y" * 500}))
    assert target.read_text() == OLD and _leftovers(tmp_path) == []


def test_evaluate_output_on_a_full_disk_keeps_the_previous_metrics(tmp_path, capsys):
    """The issue's case: a full disk at --output left 4 KiB of invalid JSON in place of the file."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 3)
    np.save(tmp_path / "e.npy", (np.eye(4)[labels] + 0.3 * rng.normal(size=(12, 4))).astype("f4"))
    np.save(tmp_path / "l.npy", labels)
    out = tmp_path / "metrics.json"
    out.write_text(OLD)
    argv = ["evaluate", "--queries", str(tmp_path / "e.npy"), "--query-labels",
            str(tmp_path / "l.npy"), "--no-ceiling", "--output", str(out)]  # fmt: skip
    with file_size_limit(100), pytest.raises(OSError, match="could not write"):
        main(argv)
    assert out.read_text() == OLD and _leftovers(tmp_path) == []
    assert main(argv) == 0
    assert json.loads(out.read_text())["num_positive_pairs"] == 4 * 3 * 2


def test_extrapolate_json_on_a_full_disk_keeps_the_previous_results(tmp_path, capsys):
    rng = np.random.default_rng(1)
    q = rng.normal(size=(5, 6))
    files = {"q": q, "p": q + 0.3 * rng.normal(size=(5, 6)), "x": rng.normal(size=(300, 6))}
    for name, arr in files.items():
        np.save(tmp_path / f"{name}.npy", arr.astype(np.float32))
    np.save(tmp_path / "owner.npy", np.arange(5))
    out = tmp_path / "tail.json"
    out.write_text(OLD)
    argv = ["extrapolate", "--queries", str(tmp_path / "q.npy"), "--positives",
            str(tmp_path / "p.npy"), "--distractors", str(tmp_path / "x.npy"),
            "--positive-query", str(tmp_path / "owner.npy"), "--gallery-size", "3000",
            "--k", "10", "--n-boot", "10", "--no-progress", "--estimators", "count",
            "--json", str(out)]  # fmt: skip
    with file_size_limit(100), pytest.raises(OSError, match="could not write"):
        main(argv)
    assert out.read_text() == OLD and _leftovers(tmp_path) == []
    assert main(argv) == 0
    assert json.loads(out.read_text())["sample_size"] == 300
