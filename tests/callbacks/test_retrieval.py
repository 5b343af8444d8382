"""The retrieval callback: split metrics as the papers report them (against scikit-learn),
duplicates from padding samplers dropped, and with 2 CPU processes (gloo) an error on
rank 0 fails every rank.

Rank 0 computes the metrics and broadcasts them; if it raised before the broadcast,
rank 1 would wait in it forever. The worker records what each rank raised."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class _GlooStrategy:
    def broadcast(self, obj, src: int = 0):
        holder = [obj]
        dist.broadcast_object_list(holder, src=src)
        return holder[0]


def _evaluate(rank: int, world: int, poison: bool) -> str:
    from rl_gap.callbacks.retrieval import RetrievalEvaluation

    callback = RetrievalEvaluation(plots=False, map_at=())
    embeddings = _embeddings(rank)
    if poison and rank == 1:
        embeddings[3, 0] = float("nan")  # gathered to rank 0, which raises on it
    labels = torch.arange(12) % 3
    indices = torch.arange(12) + 12 * rank
    callback._collect({"embeddings": embeddings, "labels": labels, "indices": indices})
    trainer = SimpleNamespace(
        is_global_zero=rank == 0, strategy=_GlooStrategy(), datamodule=None, world_size=world
    )
    logged = {}
    module = SimpleNamespace(
        device=torch.device("cpu"), log=lambda k, v, **_: logged.update({k: v})
    )
    try:
        callback._evaluate(trainer, module, "val")
        return f"ok gap={logged['val/gap']:.12f}"
    except Exception as error:  # recorded for the test to read
        return f"raised {type(error).__name__}: {error}"


def _embeddings(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    return torch.nn.functional.normalize(torch.randn(12, 4, generator=g), dim=1)


def _worker(rank: int, world: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # a clean evaluation first, then one where rank 0 fails
    for name, poison in (("clean", False), ("poisoned", True)):
        Path(folder, f"{name}{rank}.txt").write_text(_evaluate(rank, world, poison))
    # Tear down together: a rank destroying the group while the other still talks to it
    # can abort gloo ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path: Path) -> dict[str, str]:
    ctx = mp.start_processes(
        _worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=False,
        start_method="spawn",
    )  # fmt: skip
    deadline = time.monotonic() + 90
    exit_error = None
    while True:
        try:
            if ctx.join(timeout=1):
                break
        except mp.ProcessExitedException as error:  # the recorded outcomes decide; keep why
            exit_error = str(error)
            break
        if time.monotonic() > deadline:
            for process in ctx.processes:  # a hung rank: stop the workers this test started
                if process.is_alive():
                    process.terminate()
            break
    outcome = {p.stem: p.read_text() for p in tmp_path.glob("*.txt")}
    if exit_error is not None:
        outcome["exit"] = exit_error
    return outcome


@pytest.mark.ddp
def test_rank0_evaluation_error_fails_every_rank(tmp_path):
    from sklearn.metrics import average_precision_score

    outcome = _run(tmp_path)
    # clean: both ranks log the metrics of the 24 gathered items (sklearn reference)
    assert outcome["clean0"] == outcome["clean1"] and outcome["clean0"].startswith("ok")
    emb = torch.cat([_embeddings(0), _embeddings(1)]).double()
    labels = torch.cat([torch.arange(12) % 3] * 2)
    scores = (emb @ emb.T).numpy()
    rel = (labels[:, None] == labels[None]).numpy()
    keep = ~torch.eye(24, dtype=torch.bool).numpy()
    gap = float(outcome["clean0"].split("gap=")[1])
    assert gap == pytest.approx(average_precision_score(rel[keep], scores[keep]), abs=1e-6)
    # poisoned: rank 0 raises its error, rank 1 raises too instead of hanging
    assert {"poisoned0", "poisoned1"} <= set(outcome), f"a rank hung: {outcome}"
    assert outcome["poisoned0"].startswith("raised ValueError") and "NaN" in outcome["poisoned0"]
    assert outcome["poisoned1"].startswith(
        "raised RuntimeError: val evaluation failed on rank 0: ValueError"
    )
    assert "NaN" in outcome["poisoned1"]


def test_query_subset_map_and_recall_over_every_item():
    """mAP over the query rows (each without itself), R@1 over every item leave-one-out."""
    import numpy as np
    from sklearn.metrics import average_precision_score

    from rl_gap.callbacks.retrieval import evaluation_metrics

    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 4, generator=g, dtype=torch.float64)
    labels = torch.arange(30) % 5
    queries = torch.tensor([0, 3, 7, 11, 12, 24])
    metrics, _ = evaluation_metrics(x, labels, queries, ks=(1,), block_size=8)
    scores, rel = (x @ x.T).numpy(), (labels[:, None] == labels[None]).numpy()
    others = ~np.eye(30, dtype=bool)
    aps = [average_precision_score(rel[q][others[q]], scores[q][others[q]]) for q in queries]
    hits = [rel[i][others[i]][np.argmax(scores[i][others[i]])] for i in range(30)]
    assert metrics["map"] == pytest.approx(np.mean(aps), abs=1e-12)
    assert metrics["r@1"] == pytest.approx(np.mean(hits), abs=1e-12)
    assert metrics["num_queries"] == 6 and metrics["num_recall_queries"] == 30


class _OneProcess:
    def broadcast(self, obj, src: int = 0):
        return obj


def test_callback_logs_map_at_r_and_r_precision_as_brute_force():
    from rl_gap.callbacks.retrieval import RetrievalEvaluation
    from tests.metrics.functional.test_map_at_r import brute_force

    g = torch.Generator().manual_seed(4)
    embeddings = torch.randint(-2, 3, (30, 3), generator=g).float()  # exact, tied scores
    labels = torch.randint(0, 5, (30,), generator=g)
    callback = RetrievalEvaluation(plots=False, map_at=())
    callback._collect({"embeddings": embeddings, "labels": labels, "indices": torch.arange(30)})
    trainer = SimpleNamespace(
        is_global_zero=True, strategy=_OneProcess(), datamodule=None, world_size=1
    )
    logged = {}
    module = SimpleNamespace(
        device=torch.device("cpu"), log=lambda k, v, **_: logged.update({k: v})
    )
    callback._evaluate(trainer, module, "val")
    scores = (embeddings.double() @ embeddings.double().T).numpy()
    rel = (labels[:, None] == labels[None, :]).numpy()
    want_map, want_rp, _ = brute_force(scores, rel, ~torch.eye(30, dtype=torch.bool).numpy())
    assert logged["val/map@r"] == pytest.approx(want_map, abs=1e-12)
    assert logged["val/r_precision"] == pytest.approx(want_rp, abs=1e-12)


def test_callback_logs_the_online_leave_one_out_knn():
    from rl_gap.callbacks.retrieval import RetrievalEvaluation
    from tests.metrics.test_knn import loo_knn_reference

    g = torch.Generator().manual_seed(5)
    embeddings = torch.randn(40, 6, generator=g)  # continuous: no tie at the k-th neighbour
    labels = torch.randint(0, 4, (40,), generator=g)
    labels[0] = 9  # alone in its class: not scored
    callback = RetrievalEvaluation(plots=False, map_at=(), knn_k=7)
    callback._collect({"embeddings": embeddings, "labels": labels, "indices": torch.arange(40)})
    trainer = SimpleNamespace(
        is_global_zero=True, strategy=_OneProcess(), datamodule=None, world_size=1
    )
    logged = {}
    module = SimpleNamespace(
        device=torch.device("cpu"), log=lambda k, v, **_: logged.update({k: v})
    )
    callback._evaluate(trainer, module, "val")
    knn = loo_knn_reference(embeddings, labels, 7, 0.07, tops=(1, 5))
    assert logged["val/knn_top1"] == pytest.approx(knn["top1"], abs=1e-12)
    assert logged["val/knn_top5"] == pytest.approx(knn["top5"], abs=1e-12)
