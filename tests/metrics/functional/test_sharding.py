"""Sharded evaluation (2 gloo processes) equals one process, exactly.

Every rank holds the same evaluation set, scores only the engine blocks it owns and
the exact counts are summed (``rl_gap.metrics.functional.sharding``). The metrics
(gAP, mAP, R@k, R@P90, F1g/F1q, the threshold protocol, bootstrap intervals) and
the state tensors must be bit-identical to the one-process run, with exact ties
(dyadic embeddings), distractor queries (singleton classes), a query subset and
separate query / database sets; each rank must do only part of the blocks."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from sklearn.metrics import average_precision_score

BLOCK = 16


def _set(seed: int = 0, n: int = 90, dim: int = 6):
    """Dyadic embeddings (exact dot products: many ties), classes of 1..6 items."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (n, dim), generator=g).float() / 4
    labels = torch.randint(0, 30, (n,), generator=g)
    labels[:5] = torch.arange(100, 105)  # singletons: distractor queries
    return x, labels


def _cases(shard):
    """Every evaluation path, with the given shard (None: one process)."""
    from rl_gap.callbacks.retrieval import evaluation_metrics
    from rl_gap.metrics.functional import evaluate_embeddings

    x, labels = _set()
    queries, q_labels = _set(seed=1, n=40)
    out = {}
    metrics, state = evaluation_metrics(
        x, labels, None, ks=(1, 5), map_at=(3,), block_size=BLOCK, shard=shard
    )
    out["leave_one_out"] = metrics
    out["leave_one_out_state"] = {
        k: v.clone() for k, v in vars(state).items() if isinstance(v, torch.Tensor)
    }
    subset = torch.arange(0, 90, 3)
    out["query_subset"], _ = evaluation_metrics(
        x, labels, subset, ks=(1, 5), block_size=(BLOCK, 2 * BLOCK), shard=shard
    )
    out["separate_sets"] = evaluate_embeddings(
        queries, x, q_labels, labels, protocol=True, bootstrap=20, map_at=(3,), ceiling=True,
        block_size=(5, 7), cache_bytes=1500, shard=shard,
    )  # fmt: skip
    return out


class _GlooStrategy:
    def broadcast(self, obj, src: int = 0):
        holder = [obj]
        dist.broadcast_object_list(holder, src=src)
        return holder[0]


def _callback_run(rank: int, world: int) -> dict[str, float]:
    """RetrievalEvaluation under the group: this rank's half of the items is gathered."""
    from rl_gap.callbacks.retrieval import RetrievalEvaluation

    x, labels = _set()
    share = torch.arange(rank, 90, world)
    callback = RetrievalEvaluation(plots=False, map_at=(3,), block_size=BLOCK)
    callback._collect({"embeddings": x[share], "labels": labels[share], "indices": share})
    trainer = SimpleNamespace(
        is_global_zero=rank == 0, strategy=_GlooStrategy(), datamodule=None, world_size=world
    )
    module = SimpleNamespace(device=torch.device("cpu"), log=lambda *a, **k: None)
    callback._evaluate(trainer, module, "val")
    return callback.last_metrics


def _worker(rank: int, world: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from rl_gap.metrics.functional import counting
        from rl_gap.metrics.functional.sharding import process_group_shard

        blocks = []
        add = counting.NegativeCounter.add
        counting.NegativeCounter.add = lambda self, *a, **k: blocks.append(1) or add(self, *a, **k)
        result = _cases(process_group_shard())
        result["blocks"] = len(blocks)
        result["callback"] = _callback_run(rank, world)
        result["callback_blocks"] = len(blocks) - result["blocks"]
        torch.save(result, Path(folder, f"rank{rank}.pt"))
    finally:
        dist.barrier()
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(folder: Path, world: int = 2) -> list[dict]:
    ctx = mp.start_processes(
        _worker, args=(world, _free_port(), str(folder)), nprocs=world, join=False,
        start_method="spawn",
    )  # fmt: skip
    deadline = time.monotonic() + 240
    files = [folder / f"rank{r}.pt" for r in range(world)]
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for process in ctx.processes:  # a hung rank: stop the workers this test started
                    if process.is_alive():
                        process.terminate()
                pytest.fail("a sharded evaluation rank hung")
    except mp.ProcessExitedException as err:
        # Every rank saves its result before the group's teardown; gloo can abort a rank
        # inside destroy_process_group when its peer has already gone ("terminate called
        # without an active exception"). Only such an abort, after every result was
        # written, is not a failure of the evaluation under test.
        if not (err.signal_name == "SIGABRT" and all(f.is_file() for f in files)):
            raise
    return [torch.load(f) for f in files]


def _equal(a, b, path: str = "") -> list[str]:
    """Differences between nested results (floats compared exactly, NaN == NaN)."""
    if isinstance(a, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in _equal(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, torch.Tensor):
        return [] if torch.equal(a, b) else [f"{path}: tensors differ"]
    if isinstance(a, float) and np.isnan(a) and np.isnan(b):
        return []
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.mark.ddp
def test_two_process_sharded_evaluation_equals_one_process(tmp_path):
    from rl_gap.metrics.functional import counting

    blocks = []
    add = counting.NegativeCounter.add
    counting.NegativeCounter.add = lambda self, *a, **k: blocks.append(1) or add(self, *a, **k)
    try:
        single = _cases(None)
    finally:
        counting.NegativeCounter.add = add
    ranks = _spawn(tmp_path)
    for rank, result in enumerate(ranks):
        assert _equal({k: result[k] for k in single}, single) == [], rank
    # The callback (items gathered from both ranks) logs the one-process numbers.
    assert ranks[0]["callback"] == ranks[1]["callback"]
    for key, value in single["leave_one_out"].items():
        logged = ranks[0]["callback"][f"val/{key}"]
        assert logged == value or (np.isnan(logged) and np.isnan(value)), key
    # Each rank counted only part of the blocks; together, every block once.
    assert 0 < ranks[0]["blocks"] < len(blocks) and 0 < ranks[1]["blocks"] < len(blocks)
    assert ranks[0]["blocks"] + ranks[1]["blocks"] == len(blocks)
    assert ranks[0]["callback_blocks"] > 0 and ranks[1]["callback_blocks"] > 0
    # An independent reference for the shared numbers: scikit-learn's gAP.
    x, labels = _set()
    scores = (x.double() @ x.double().T).numpy()
    rel = (labels[:, None] == labels[None]).numpy()
    keep = ~np.eye(90, dtype=bool)
    reference = average_precision_score(rel[keep], scores[keep])
    assert ranks[1]["leave_one_out"]["gap"] == pytest.approx(reference, abs=1e-12)
    _, counts = torch.unique(labels, return_counts=True)
    singletons = float((counts == 1).sum())  # queries without a positive
    assert singletons >= 5 and ranks[1]["leave_one_out"]["num_distractor_queries"] == singletons


def test_shard_arguments_are_checked():
    from rl_gap.metrics.functional.sharding import Shard, process_group_shard

    with pytest.raises(ValueError, match="rank must be in"):
        Shard(2, 2, lambda t: None)
    with pytest.raises(ValueError, match="world must be"):
        Shard(0, 0, lambda t: None)
    assert process_group_shard() is None  # no process group: one process
