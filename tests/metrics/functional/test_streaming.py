"""The engine reads the database block by block: a memory-mapped (or float16)
database is never copied or widened whole, and the metrics equal the in-memory
path's and scikit-learn's on the same scores."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score
from torch.overrides import TorchFunctionMode

from rl_gap.metrics.functional import evaluate_embeddings, state
from rl_gap.metrics.functional.score_norm import background_offsets

BLOCK = 16
DIM = 12


class WholeCopyDetector(TorchFunctionMode):
    """Records every op that reads a (rows, DIM) float result of more than ``BLOCK``
    rows out of the watched tensor's memory: a whole (or half) copy, widening or
    permutation of it, as opposed to the engine's per-block reads."""

    def __init__(self, watched: torch.Tensor) -> None:
        super().__init__()
        self.storage = watched.untyped_storage().data_ptr()
        self.copies: list[str] = []
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        sources = [a for a in args if isinstance(a, torch.Tensor)]
        if any(a.untyped_storage().data_ptr() == self.storage for a in sources):
            self.reads += 1
            if (
                isinstance(out, torch.Tensor)
                and out.dtype.is_floating_point
                and out.ndim == 2
                and out.shape[1] == DIM
                and out.shape[0] > BLOCK
                and out.untyped_storage().data_ptr() != self.storage
            ):
                self.copies.append(f"{getattr(func, '__name__', func)} -> {tuple(out.shape)}")
        return out


def _problem(n_q: int = 40, n_d: int = 230, seed: int = 0):
    """Dyadic embeddings (scores exact in float16 inputs, float32 and float64 sums:
    many exact ties), labels with database-only classes and a distractor query."""
    g = torch.Generator().manual_seed(seed)
    queries = torch.randint(-3, 4, (n_q, DIM), generator=g).float() / 4
    database = torch.randint(-3, 4, (n_d, DIM), generator=g).float() / 4
    q_lab = torch.randint(0, 12, (n_q,), generator=g)
    d_lab = torch.randint(0, 15, (n_d,), generator=g)
    q_lab[0] = 99  # a distractor query: no positive in the database
    return queries, database, q_lab, d_lab


def _view(mapped: np.memmap) -> torch.Tensor:
    """The map as a tensor without a copy (read-only: nothing writes to it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.asarray(mapped))


def _memmap(tmp_path, array: np.ndarray, name: str) -> np.memmap:
    path = tmp_path / f"{name}.npy"
    np.save(path, array)
    return np.load(path, mmap_mode="r")


def _sklearn_gap(queries, database, q_lab, d_lab) -> float:
    scores = (queries.double() @ database.double().T).numpy()
    rel = (q_lab[:, None] == d_lab[None]).numpy()
    return average_precision_score(rel.ravel(), scores.ravel())


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_memory_mapped_database_is_read_block_wise(tmp_path, dtype):
    queries, database, q_lab, d_lab = _problem()
    mapped = _memmap(tmp_path, database.numpy().astype(dtype), "database")
    kwargs = dict(block_size=BLOCK, cache_bytes=0, protocol=True, ks=(1, 5))
    detector = WholeCopyDetector(_view(mapped))
    with detector:
        streamed = evaluate_embeddings(queries, mapped, q_lab, d_lab, **kwargs)
    assert detector.reads > 0  # the detector did see the engine read the map
    assert detector.copies == [], detector.copies
    in_memory = evaluate_embeddings(
        queries, torch.from_numpy(mapped.astype(np.float32)), q_lab, d_lab, **kwargs
    )
    assert streamed == in_memory
    assert streamed["gap"] == pytest.approx(
        _sklearn_gap(queries, database, q_lab, d_lab), abs=1e-12
    )
    assert streamed["num_distractor_queries"] == 1.0


def test_leave_one_out_on_a_memory_map_is_read_block_wise(tmp_path):
    """One memory-mapped set as queries and database (leave-one-out, symmetric path and
    the protocol halves, which read their rows from the map per block)."""
    _, database, _, d_lab = _problem()
    mapped = _memmap(tmp_path, database.numpy().astype(np.float16), "set")
    detector = WholeCopyDetector(_view(mapped))
    kwargs = dict(exclude_self=True, block_size=BLOCK, cache_bytes=0, protocol=True)
    with detector:
        streamed = evaluate_embeddings(mapped, mapped, d_lab, d_lab, **kwargs)
    assert detector.copies == [], detector.copies
    in_memory = evaluate_embeddings(database, database.clone(), d_lab, d_lab, **kwargs)
    assert streamed == in_memory
    scores = (database.double() @ database.double().T).numpy()
    rel = (d_lab[:, None] == d_lab[None]).numpy()
    keep = ~np.eye(len(d_lab), dtype=bool)
    assert streamed["gap"] == pytest.approx(
        average_precision_score(rel[keep], scores[keep]), abs=1e-12
    )


def test_background_is_read_block_wise(tmp_path):
    queries, database, q_lab, d_lab = _problem()
    g = torch.Generator().manual_seed(5)
    background = torch.randint(-3, 4, (300, DIM), generator=g).float() / 4
    mapped = _memmap(tmp_path, background.numpy().astype(np.float16), "background")
    detector = WholeCopyDetector(_view(mapped))
    with detector:
        offsets = background_offsets(queries, _view(mapped), block_size=BLOCK)
        streamed = evaluate_embeddings(
            queries, database, q_lab, d_lab, background=mapped, block_size=BLOCK
        )
    assert detector.copies == [], detector.copies
    top3 = np.sort((queries.double() @ background.double().T).numpy(), axis=1)[:, ::-1][:, :3]
    assert offsets.numpy() == pytest.approx(top3.mean(1), abs=1e-6)
    # The engine shifts each query's score blocks: gAP of q . d - offset (sklearn).
    shifted = (queries.double() @ database.double().T).numpy() - offsets.double().numpy()[:, None]
    rel = (q_lab[:, None] == d_lab[None]).numpy()
    assert streamed["gap"] == pytest.approx(
        average_precision_score(rel.ravel(), shifted.ravel()), abs=1e-12
    )


def test_accelerator_counting_path_equals_host_path(monkeypatch):
    """The eager counting path used on accelerators (one search per score, fixed-size
    ``index_add_`` histograms, block sizes from the host copy of the offsets: no
    read-back per block), run here on CPU tensors, gives the host path's state."""
    from rl_gap.metrics.functional import counting

    queries, database, q_lab, d_lab = _problem(60, 180, seed=3)
    monkeypatch.setattr(counting, "NATIVE_MIN_PAIRS", 1 << 40)  # eager on the host too
    kwargs = dict(block_size=(BLOCK, 2 * BLOCK), bootstrap=5, ks=(1, 3), protocol=True)
    host = evaluate_embeddings(queries, database, q_lab, d_lab, **kwargs)
    calls = []
    monkeypatch.setattr(state, "on_host", lambda x: calls.append(1) and False)
    accelerator = evaluate_embeddings(queries, database, q_lab, d_lab, **kwargs)
    assert calls
    assert accelerator == host
    assert host["gap"] == pytest.approx(_sklearn_gap(queries, database, q_lab, d_lab), abs=1e-12)


def test_each_database_block_is_read_once_per_pass(tmp_path, monkeypatch):
    """With more database rows than queries, the counting pass visits column blocks
    outermost: each block of a memory-mapped database is read once, not once per
    query block (a map larger than RAM would be read from disk Q / block times)."""
    from rl_gap.metrics.functional import counting
    from rl_gap.metrics.functional.engine import state_from_embeddings

    queries, database, q_lab, d_lab = _problem()  # 40 queries (3 blocks), 230 rows (15)
    mapped = _memmap(tmp_path, database.numpy(), "database")
    detector = WholeCopyDetector(_view(mapped))
    at_first_count = []
    add = counting.NegativeCounter.add
    monkeypatch.setattr(
        counting.NegativeCounter, "add",
        lambda self, *a, **k: at_first_count.append(detector.reads) or add(self, *a, **k),
    )  # fmt: skip
    with detector:
        state_from_embeddings(queries, mapped, q_lab, d_lab, block_size=BLOCK, cache_bytes=0)
    # Reads of the counting pass: from the first block's (already read when the
    # first block is counted) to the end.
    pass_reads = detector.reads - at_first_count[0] + 1
    assert len(at_first_count) == 3 * 15  # every block counted
    assert pass_reads == 15
