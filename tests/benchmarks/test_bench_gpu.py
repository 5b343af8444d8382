"""benchmarks/bench_gpu.py: a clear message and exit status 2 without CUDA; its table on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gpu.py"


def run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


def test_exits_with_message_without_cuda(tmp_path):
    out = run(tmp_path=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "needs a CUDA device" in out.stderr and "nothing was measured" in out.stderr
    assert out.stdout == ""


def test_cpu_run_prints_the_ratio_table(tmp_path):
    target = tmp_path / "rows.json"
    out = run(
        "--device", "cpu", "--batches", "32", "--alphas", "0", "0.9", "--repeats", "1",
        "--engine-size", "300", "--dim", "16", "--json", str(target), tmp_path=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = json.loads(target.read_text())
    names = [r["name"] for r in rows]
    assert names == ["infonce", "gsap fast", "gsap fast", "bare GEMM 300x300", "engine 300x300"]
    assert rows[0]["time_ratio"] == 1.0 and rows[3]["time_ratio"] == 1.0
    for r in rows:
        assert r["ms"] > 0 and r["peak_gib"] is None
        assert abs(r["time_ratio"] * rows[0 if r["batch"] else 3]["ms"] - r["ms"]) < 1e-6 * r["ms"]
    assert "x base" in out.stdout and "gsap fast" in out.stdout
