"""Block reads and scores: exact rows, recycled buffers, memory bounded by the block."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from rl_gap.metrics.functional.engine_blocks import BlockReader, BlockScorer, mirror_upper
from rl_gap.metrics.functional.engine_plan import plan_problem


def test_reader_returns_the_ordered_rows_in_one_recycled_buffer():
    source = torch.randn(20, 3).half()
    order = torch.randperm(20, generator=torch.Generator().manual_seed(0))
    reader = BlockReader(source, order, torch.device("cpu"), torch.float32, max_rows=8)
    first = reader.read(0, 8)
    pointer = first.data_ptr()
    assert torch.equal(first, source[order[:8]].float())
    last = reader.read(16, 20)
    assert torch.equal(last, source[order[16:]].float())
    assert last.data_ptr() == pointer  # the same buffer, not a fresh block


def test_reader_without_order_or_conversion_is_a_view():
    source = torch.randn(10, 2, requires_grad=True)
    reader = BlockReader(source, None, torch.device("cpu"), torch.float32, max_rows=4)
    block = reader.read(4, 8)
    assert torch.equal(block, source.detach()[4:8])
    assert block.data_ptr() == source.data_ptr() + 4 * 2 * 4


def test_scores_match_float64_and_self_pairs_are_masked():
    g = torch.Generator().manual_seed(1)
    db = torch.randn(13, 5, generator=g)
    labels = torch.randint(0, 3, (13,), generator=g)
    index = torch.tensor([4, 0, 9])
    plan = plan_problem(db[index], db, labels[index], labels, query_index=index, block_size=4)
    scorer = BlockScorer(plan)
    d_rows = plan.d_order
    for c0 in range(0, 13, 4):
        c1 = min(13, c0 + 4)
        block = scorer.score(0, 3, c0, c1).clone()
        ref = db[index[plan.perm_q]].double() @ db[d_rows[c0:c1]].double().T
        torch.testing.assert_close(block.double(), ref, rtol=0, atol=1e-5)
        scorer.mask_self(block, 0, 3, c0)
        # -inf exactly where the sorted column is the query's own row
        is_self = d_rows[c0:c1][None, :] == index[plan.perm_q][:, None]
        assert torch.equal(torch.isinf(block), is_self)


def test_unkept_blocks_share_one_output_and_kept_ones_are_fresh():
    x = torch.randn(12, 4)
    plan = plan_problem(x, None, torch.arange(12) % 3, exclude_self=True, block_size=4)
    scorer = BlockScorer(plan)
    a = scorer.score(0, 4, 4, 8)
    b = scorer.score(4, 8, 8, 12)
    kept = scorer.score(0, 4, 8, 12, keep=True)
    assert a.data_ptr() == b.data_ptr() != kept.data_ptr()
    # symmetric plans read queries from the database: both sides stay valid together
    torch.testing.assert_close(kept, x[plan.d_order[:4]] @ x[plan.d_order[8:]].T)


PEAK_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np, torch
    from rl_gap.metrics.functional import state_from_embeddings

    path, n, dim, block, num_q, normalize = sys.argv[1], *map(int, sys.argv[2:])
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    labels = torch.as_tensor(rng.integers(0, n // 4, n))
    index = torch.as_tensor(rng.choice(n, num_q, replace=False))
    db = np.load(path, mmap_mode="r")
    queries = torch.from_numpy(np.ascontiguousarray(db[index.numpy()]))

    def evaluate(database, q, lab, idx):
        state_from_embeddings(q, database, lab[idx], lab, query_index=idx,
                              block_size=block, cache_bytes=0, validated=True,
                              normalize=bool(normalize))

    small = torch.randn(4 * block, dim)
    evaluate(small, small[:num_q], torch.arange(4 * block) // 4, torch.arange(num_q))
    float(np.asarray(db).sum(dtype=np.float64))  # the map's pages resident before the base

    def status(key):
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key))

    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # peak := current
    base = status("VmRSS:")
    evaluate(db, queries, labels, index)
    print(status("VmHWM:") - base)
    """
)


@pytest.mark.parametrize("size", [1, 5, 255, 256, 257, 600])
def test_mirror_upper_copies_the_upper_triangle_exactly(size):
    block = torch.randn(size, size, generator=torch.Generator().manual_seed(size))
    upper = torch.triu_indices(size, size)
    expected = torch.empty_like(block)
    expected[upper[0], upper[1]] = block[upper[0], upper[1]]
    expected[upper[1], upper[0]] = block[upper[0], upper[1]]
    mirror_upper(block)
    assert torch.equal(block, expected)


def test_symmetric_diagonal_blocks_are_symmetric():
    """One embedding set, leave-one-out: a diagonal block's GEMM need not round
    s(i, j) and s(j, i) alike; the scorer returns them as one value."""
    x = torch.randn(40, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    labels = torch.zeros(40, dtype=torch.long)
    plan = plan_problem(x, None, labels, exclude_self=True, block_size=16)
    assert plan.symmetric
    scorer = BlockScorer(plan)
    for start, stop in plan.row_blocks:
        for keep in (False, True):
            block = scorer.score(start, stop, start, stop, keep=keep)
            assert torch.equal(block, block.T)
            torch.testing.assert_close(block, x[start:stop] @ x[start:stop].T)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
@pytest.mark.parametrize("normalize", [False, True])
def test_memory_mapped_database_peak_memory_is_bounded_by_the_block(tmp_path, normalize):
    """A memory-mapped database larger than the process needs: the peak memory the
    evaluation adds stays a few blocks, whatever the number of blocks (per-block
    tensors freed to the C allocator grew it past the database's own size), also
    with cosine scores (``normalize``: each block normalised in its buffer, where a
    normalised copy of the database would take its whole size)."""
    n, dim, block, num_q = 200_000, 64, 2048, 256
    path = tmp_path / "database.npy"
    database = np.lib.format.open_memmap(path, "w+", np.float32, (n, dim))
    database[:] = np.random.default_rng(1).standard_normal((n, dim), dtype=np.float32)
    database.flush()
    del database
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pytest.skip("cannot reset the peak RSS here (/proc/self/clear_refs)")
    run = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, str(path), str(n), str(dim), str(block), str(num_q),
         str(int(normalize))],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    peak = int(run.stdout.split()[-1])
    block_bytes = (num_q + block) * dim * 4 + num_q * block * 4  # two reads + one score block
    index_bytes = 8 * n  # one (D,) int64 (the label sort and its index)
    bound = 4 * block_bytes + 6 * index_bytes
    assert peak < bound, (peak, bound, n * dim * 4)
