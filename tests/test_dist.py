"""``rl_gap.dist`` on 2 gloo processes with ragged rows (3 + 1): one gather serves the
plain, counted and differentiable forms; reductions and the byte counter; dropping the
padding sampler's repeated items."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

SIZES = [3, 1]


def _rows(rank: int) -> torch.Tensor:
    start = sum(SIZES[:rank])
    return torch.arange(start * 2, (start + SIZES[rank]) * 2, dtype=torch.float64).view(-1, 2)


def _worker(rank: int, port: int, folder: str) -> None:
    import torch.distributed as torch_dist

    from rl_gap import dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch_dist.init_process_group("gloo", rank=rank, world_size=2)
    x = _rows(rank)
    out = {"rank": dist.rank(), "world": dist.world_size()}
    with dist.counting() as counter:
        out["ragged"] = dist.all_gather_ragged(x)
        out["ragged_bytes"] = counter.bytes_sent  # its size (8 B) and its own rows
        out["plain"] = dist.gather_no_grad(x)
        out["slice"] = dist.local_slice(x.shape[0])
        out["after_plain_bytes"] = counter.bytes_sent  # module gathers are not counted
    leaf = x.clone().requires_grad_(True)
    gathered = dist.gather_with_grad(leaf)
    weights = torch.arange(1.0, 9.0, dtype=torch.float64).view(4, 2)
    (gathered * weights).sum().backward()  # the same global loss on every rank
    out["grad"] = leaf.grad
    a, b = torch.tensor([1.0 + rank, 2.0]), torch.tensor([10.0 * rank])
    dist.all_reduce_flat([a, b])
    out["flat"] = (a, b)
    out["max"] = dist.all_reduce(torch.tensor([float(rank)]), "max")
    out["count"] = dist.global_count(rank + 1, torch.device("cpu"))
    torch.save(out, Path(folder, f"{rank}.pt"))
    torch_dist.barrier()
    torch_dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.ddp
def test_two_ragged_ranks(tmp_path: Path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2)
    everything = torch.cat([_rows(0), _rows(1)])
    weights = torch.arange(1.0, 9.0, dtype=torch.float64).view(4, 2)
    for rank in (0, 1):
        out = torch.load(tmp_path / f"{rank}.pt", weights_only=False)
        assert (out["rank"], out["world"]) == (rank, 2)
        assert torch.equal(out["ragged"], everything)
        assert torch.equal(out["plain"], everything)
        assert out["ragged_bytes"] == 8 + SIZES[rank] * 2 * 8
        assert out["after_plain_bytes"] == out["ragged_bytes"]
        start = sum(SIZES[:rank])
        assert out["slice"] == slice(start, start + SIZES[rank])
        # d/dx of the loss summed over the 2 ranks: twice the weights of its own rows
        assert torch.equal(out["grad"], 2 * weights[start : start + SIZES[rank]])
        assert out["flat"][0].tolist() == [3.0, 4.0] and out["flat"][1].tolist() == [10.0]
        assert out["max"].tolist() == [1.0]
        assert out["count"] == 3


def test_one_process_gathers_are_identities_and_sharded_calls_need_a_group():
    from rl_gap import dist

    x = torch.randn(3, 2)
    assert dist.gather_with_grad(x) is x and dist.gather_no_grad(x) is x
    assert dist.local_slice(3) == slice(0, 3)
    with pytest.raises(RuntimeError, match="needs an initialised torch.distributed"):
        dist.all_gather_ragged(x)
    with pytest.raises(ValueError, match="all_reduce op must be one of"):
        dist.all_reduce(x, "mean")


def test_unique_by_index_drops_padding_duplicates():
    from rl_gap.dist import unique_by_index

    emb = torch.arange(10.0).reshape(5, 2)
    index = torch.tensor([2, 0, 1, 2, 3])
    e, y, i = unique_by_index(index, emb, torch.tensor([7, 8, 9, 7, 8]), index)
    assert i.tolist() == [0, 1, 2, 3] and y.tolist() == [8, 9, 7, 8]
    assert torch.equal(e[2], emb[0])


def test_unique_by_index_keeps_one_copy_in_index_order():
    from rl_gap.dist import unique_by_index

    indices = torch.tensor([3, 0, 2, 0, 1, 3])  # a padding sampler repeats items 0 and 3
    embeddings = indices[:, None].float() * torch.ones(1, 2)
    emb, labels, kept = unique_by_index(indices, embeddings, indices * 10, indices)
    assert kept.tolist() == [0, 1, 2, 3] and labels.tolist() == [0, 10, 20, 30]
    assert emb[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    index = torch.tensor([2, 0, 1, 0, 2])  # DistributedSampler padding repeats 0 and 2
    values = torch.tensor([20.0, 0.0, 10.0, 0.0, 20.0])
    (kept,) = unique_by_index(index, values)
    assert kept.tolist() == [0.0, 10.0, 20.0]
