"""torchmetrics classes: several updates == one call == the engine; 2-rank DDP == 1 process."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rl_gap.metrics import (
    GlobalAP,
    MAPAtR,
    MeanAP,
    RecallAtK,
    RecallAtPrecision,
    RetrievalMetrics,
    RPrecision,
    ThresholdProtocol,
)
from rl_gap.metrics.functional import evaluate_embeddings


def _data(n: int = 96, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (n, 6), generator=g).double() / 4  # exact dot products
    labels = torch.randint(0, 14, (n,), generator=g)
    return x, labels


def _single_metrics():
    return {
        "gap": GlobalAP(),
        "map": MeanAP(),
        "map@5": MeanAP(k=5),
        "r@1": RecallAtK(k=1),
        "r@p50": RecallAtPrecision(precision=0.5),
    }


def test_several_updates_equal_one_call_and_engine():
    x, labels = _data()
    ref = evaluate_embeddings(
        x, x, labels, labels, exclude_self=True, map_at=(5,), precisions=(0.5,)
    )
    for key, metric in _single_metrics().items():
        once = type(metric)(**_kwargs(metric))
        once.update(x, labels)
        for chunk in torch.arange(96).split(25):
            metric.update(x[chunk], labels[chunk])
        assert float(metric.compute()) == float(once.compute()) == ref[key], key


def _kwargs(metric):
    if isinstance(metric, MeanAP):
        return {"k": None if metric.key == "map" else 5}
    if isinstance(metric, RecallAtK):
        return {"k": 1}
    if isinstance(metric, RecallAtPrecision):
        return {"precision": 0.5}
    return {}


def test_map_at_r_and_r_precision_classes_equal_brute_force():
    from tests.metrics.functional.test_map_at_r import brute_force

    x, labels = _data(seed=2)  # dyadic: exact, heavily tied scores
    labels[0] = 99  # a query without positives
    scores = (x @ x.T).numpy()
    rel = (labels[:, None] == labels[None, :]).numpy()
    want_map, want_rp, _ = brute_force(scores, rel, ~torch.eye(96, dtype=torch.bool).numpy())
    for metric, want in ((MAPAtR(), want_map), (RPrecision(), want_rp)):
        for chunk in torch.arange(96).split(30):
            metric.update(x[chunk], labels[chunk])
        assert float(metric.compute()) == pytest.approx(want, abs=1e-12)
    suite = RetrievalMetrics()
    suite.update(x, labels)
    out = suite.compute()
    assert float(out["map@r"]) == pytest.approx(want_map, abs=1e-12)
    assert float(out["r_precision"]) == pytest.approx(want_rp, abs=1e-12)


def test_separate_sets_and_dict_output():
    x, labels = _data(seed=1)
    is_query = torch.arange(96) % 3 == 0
    metric = RetrievalMetrics(leave_one_out=False, protocol=True)
    for chunk in torch.arange(96).split(40):
        metric.update(x[chunk], labels[chunk], is_query[chunk])
    out = metric.compute()
    ref = evaluate_embeddings(
        x[is_query], x[~is_query], labels[is_query], labels[~is_query], protocol=True, ceiling=False
    )
    assert {k: float(v) for k, v in out.items()} == pytest.approx(ref, abs=1e-12, nan_ok=True)
    proto = ThresholdProtocol(leave_one_out=False)
    proto.update(x, labels, is_query)
    got = proto.compute()
    assert float(got["f1g"]) == ref["protocol_f1g"] and float(got["f1q"]) == ref["protocol_f1q"]


def test_update_errors():
    metric = GlobalAP()
    with pytest.raises(ValueError, match="no query"):
        metric.compute()
    with pytest.raises(ValueError, match="labels shape"):
        metric.update(torch.randn(4, 3), torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="is_query"):
        RetrievalMetrics(leave_one_out=False).update(torch.randn(4, 3), torch.zeros(4))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        x, labels = _data()
        mine = torch.arange(96)[rank::world][: 48 - rank]  # uneven shards, some items unused
        metric = RetrievalMetrics(precisions=(0.5,), protocol=True)
        for chunk in mine.split(13):
            metric.update(x[chunk], labels[chunk])
        out = {k: float(v) for k, v in metric.compute().items()}
        if rank == 0:
            used = torch.cat([torch.arange(96)[r::world][: 48 - r] for r in range(world)])
            queue.put((out, used.tolist()))  # plain data: the worker exits before get()
        dist.barrier()  # tear down together (a lone teardown can abort gloo)
    finally:
        dist.destroy_process_group()


def test_simulated_two_rank_sync_equals_one_process():
    """Fast variant: torchmetrics' sync with a gather that returns two ranks' states."""
    x, labels = _data()
    states: dict[str, list[torch.Tensor]] = {}

    def fake_gather(tensor, group=None):
        for parts in states.values():
            if parts[0].shape == tensor.shape and torch.equal(parts[0], tensor):
                return parts
        return [tensor, tensor[:0]]  # empty database states

    ranks = [
        RetrievalMetrics(
            precisions=(0.5,),
            protocol=True,
            dist_sync_fn=fake_gather,
            distributed_available_fn=lambda: True,
        )
        for _ in range(2)
    ]
    for r, metric in enumerate(ranks):
        for chunk in torch.arange(96)[r::2].split(13):
            metric.update(x[chunk], labels[chunk])
    for name in ("query_embeddings", "query_labels"):
        states[name] = [torch.cat(getattr(m, name)) for m in ranks]
    out = {k: float(v) for k, v in ranks[0].compute().items()}
    single = RetrievalMetrics(precisions=(0.5,), protocol=True)
    single.update(x, labels)
    assert out == pytest.approx(
        {k: float(v) for k, v in single.compute().items()}, abs=1e-12, nan_ok=True
    )


@pytest.mark.ddp
@pytest.mark.slow
def test_two_process_ddp_equals_one_process():
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_ddp_worker, args=(2, _free_port(), queue), nprocs=2, start_method="spawn")
    out, used = queue.get()
    used = torch.tensor(used)
    x, labels = _data()
    single = RetrievalMetrics(precisions=(0.5,), protocol=True)
    single.update(x[used], labels[used])
    ref = {k: float(v) for k, v in single.compute().items()}
    assert out == pytest.approx(ref, abs=1e-12, nan_ok=True)
