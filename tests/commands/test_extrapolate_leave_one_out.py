"""``rl-gap extrapolate`` leave-one-out (queries = positives): values against brute force in
float64, and the estimate's peak memory bounded by the kept arrays plus a block."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from rl_gap.cli import main


def brute_force_loo(x: np.ndarray, labels: np.ndarray, z: np.ndarray, n: int, k: int):
    """(sample mAP@k of the gallery of other same-label items + the S distractors,
    count-estimator mAP@k at N: rank = j + N·K/S), each query leaving itself out."""
    s_pos = x.astype(np.float64) @ x.astype(np.float64).T
    s_dis = (x @ z.T).astype(np.float64)  # float32 scores, as the sample state keeps them
    realized, count = [], []
    for i in range(len(x)):
        mates = np.flatnonzero((labels == labels[i]) & (np.arange(len(x)) != i))
        pos = s_pos[i, mates]
        m, sample_size = len(pos), z.shape[0]
        ap_s = ap_c = 0.0
        for s in pos:
            j = int((pos >= s).sum())
            hits = int((s_dis[i] >= s).sum())
            if j + hits <= k:
                ap_s += j / (j + hits)
            rank = j + n * hits / sample_size
            if rank <= k:
                ap_c += j / rank
        realized.append(ap_s / min(k, m))
        count.append(ap_c / min(k, m))
    return float(np.mean(realized)), float(np.mean(count))


@pytest.mark.parametrize("block_values", [None, 64])
def test_leave_one_out_matches_brute_force(tmp_path, capsys, monkeypatch, block_values):
    if block_values is not None:  # many row blocks: the blocked path gives the same values
        monkeypatch.setattr("rl_gap.metrics.tail.rows.ROW_BLOCK_VALUES", block_values)
    rng = np.random.default_rng(3)
    labels = np.arange(48) % 4
    x = (rng.standard_normal((4, 8))[labels] + rng.standard_normal((48, 8))).astype(np.float32)
    z = rng.standard_normal((80, 8)).astype(np.float32)
    for name, value in (("items", x), ("labels", labels), ("z", z)):
        np.save(tmp_path / f"{name}.npy", value)
    n, k = 800, 6  # k below the 11 positives: only the top k are kept per query
    items, lab = str(tmp_path / "items.npy"), str(tmp_path / "labels.npy")
    rc = main([
        "extrapolate", "--queries", items, "--positives", items, "--query-labels", lab,
        "--positive-labels", lab, "--distractors", str(tmp_path / "z.npy"),
        "--gallery-size", str(n), "--k", str(k), "--estimators", "sample,count",
        "--n-boot", "20", "--format", "json", "--no-progress",
    ])  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    realized, count = brute_force_loo(x, labels, z, n, k)
    assert out["estimators"]["sample"]["map"] == pytest.approx(realized, abs=1e-12)
    assert out["estimators"]["count"]["map"] == pytest.approx(count, abs=1e-12)
    assert out["n_queries"] == 48


PEAK_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from rl_gap.commands.extrapolate_inputs import top_positive_scores
    from rl_gap.metrics.tail import rows, tail_predictor
    from rl_gap.metrics.tail.build import new_state
    from rl_gap.metrics.tail.sampling import stream_scores

    n, S, k, block = map(int, sys.argv[1:])
    torch.set_num_threads(1)
    rows.ROW_BLOCK_VALUES = block
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(n) % 8
    noise = torch.randn(n, 16, generator=g)
    x = torch.nn.functional.normalize(torch.randn(8, 16, generator=g)[labels] + 2 * noise, dim=1)
    z = torch.nn.functional.normalize(torch.randn(S, 16, generator=g), dim=1)
    pos = top_positive_scores(x, x, k, query_codes=labels, positive_codes=labels,
                              leave_one_out=True)
    state = new_state(n, k, estimators=["evt_support"], sample_size=S)
    stream_scores(x, z, state)
    predictor = tail_predictor(pos, state, k)

    def status(key):
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key))

    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # peak := current
    base = status("VmRSS:")
    predictor.estimate("evt_support", 100 * S, budget=True)
    print(status("VmHWM:") - base, state.capacity)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_leave_one_out_estimate_peak_memory_is_the_kept_arrays_plus_a_block(tmp_path):
    """Leave-one-out on 4,000 items (500 positives each, k = 400): the memory the estimate
    adds is a few (Q, T) arrays it keeps (the full sample's top scores, hardness, counts)
    and a block's temporaries, not the tens of full (Q, T) temporaries of one-block code."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pytest.skip("cannot reset the peak RSS here (/proc/self/clear_refs)")
    n, S, k, block = 4000, 2000, 400, 1 << 16
    # Freed blocks returned to the system at once: the peak measures data, not the allocator.
    env = {"MALLOC_MMAP_THRESHOLD_": "65536", "PATH": "/usr/bin:/bin"}
    env.update({key: v for key, v in __import__("os").environ.items() if key.startswith("PYTHON")})
    run = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, str(n), str(S), str(k), str(block)],
        capture_output=True, text=True, timeout=600, check=True, env=env,
    )  # fmt: skip
    peak, capacity = map(int, run.stdout.split()[-2:])
    full = n * capacity * 8  # one (Q, T) float64 array
    bound = 4 * full + 40 * block * 8
    assert peak < bound, (peak, bound, full)
