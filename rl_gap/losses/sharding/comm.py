"""Collectives of the sharded losses: autograd-aware reductions and a byte counter.

A sharded loss (docs/definitions.md, "Sharded losses") sees only this rank's
consecutive block of rows of the global (B, M) matrix. Its global value is
built from *global statistics* (sums over every rank of local partials) and
a final sum of local partial losses. Two autograd rules make the backward
give each rank its rows of the single-process gradient:

- ``reduce_statistic(t)``: forward all-reduce (sum); backward all-reduce (sum).
  Every rank consumes the global statistic in a *different* local term, so
  the gradient of the statistic is the sum over ranks of those terms'.
- ``reduce_partials(t)``: forward all-reduce (sum); backward identity. The
  result is the loss itself, one value held by every rank; its upstream
  gradient is that of the same scalar on every rank, so each rank passes it
  to its own partial unchanged.

A term that is the same on every rank (e.g. a function of global statistics
only) enters the partial sum on rank 0 alone (``first_rank_only``), so it is
counted once and its statistics' gradient is all-reduced once.
(``torch.distributed.all_reduce`` has no backward; lightly #1920.)

Every collective here adds the bytes this rank contributes to
``COUNTER`` (the tensor it puts into the all-reduce, or its own part of an
all-gather); a ring all-reduce sends at most twice that over the wire.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class CommCounter:
    """Bytes this rank contributed to collectives, and how many collectives ran."""

    bytes_sent: int = 0
    calls: int = 0

    def add(self, tensor: torch.Tensor) -> None:
        self.bytes_sent += tensor.numel() * tensor.element_size()
        self.calls += 1

    def reset(self) -> None:
        self.bytes_sent = 0
        self.calls = 0


COUNTER = CommCounter()


@contextlib.contextmanager
def counting():
    """Reset ``COUNTER`` on entry and yield it (read it after the block)."""
    COUNTER.reset()
    yield COUNTER


def require_group() -> tuple[int, int]:
    """(rank, world size) of the default process group; clear error without one."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "a sharded loss call (sharded=True) needs an initialised torch.distributed "
            "process group; call the loss without sharded=True on one process"
        )
    return dist.get_rank(), dist.get_world_size()


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce (``sum``, ``max`` or ``min``) without autograd; returns ``tensor``."""
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    COUNTER.add(tensor)
    dist.all_reduce(tensor, op=ops[op])
    return tensor


def all_gather_sizes(n: int, device: torch.device) -> list[int]:
    """Every rank's ``n`` (rank order)."""
    _, world = require_group()
    size = torch.tensor([n], dtype=torch.int64, device=device)
    parts = [torch.empty_like(size) for _ in range(world)]
    COUNTER.add(size)
    dist.all_gather(parts, size)
    return [int(p) for p in parts]


def all_gather_ragged(x: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
    """Concatenate every rank's ``x`` (n_r, ...) along dim 0 in rank order, no autograd."""
    sizes = all_gather_sizes(x.shape[0], x.device) if sizes is None else sizes
    pad = max(sizes) - x.shape[0]
    padded = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))]) if pad else x.contiguous()
    parts = [torch.empty_like(padded) for _ in sizes]
    COUNTER.add(x)
    dist.all_gather(parts, padded)
    return torch.cat([p[:n] for p, n in zip(parts, sizes)])


class _ReduceStatistic(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return all_reduce(x.detach().clone(memory_format=torch.contiguous_format))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return all_reduce(grad.clone(memory_format=torch.contiguous_format))


class _ReducePartials(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return all_reduce(x.detach().clone(memory_format=torch.contiguous_format))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:  # type: ignore[override]
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return grad * ctx.factor, None


def reduce_statistic(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over ranks, consumed by rank-local terms (backward: sum over ranks)."""
    return _ReduceStatistic.apply(x)


def reduce_partials(x: torch.Tensor) -> torch.Tensor:
    """Sum over ranks of each rank's partial loss ``x`` = the loss (backward: identity)."""
    return _ReducePartials.apply(x)


def scale_grad(x: torch.Tensor, factor: float) -> torch.Tensor:
    """Identity whose backward multiplies the gradient by ``factor``."""
    return _ScaleGrad.apply(x, float(factor))


def first_rank_only(x: torch.Tensor) -> torch.Tensor:
    """``x`` on rank 0, a connected zero elsewhere (a replicated term counted once)."""
    rank, _ = require_group()
    return x if rank == 0 else x * 0.0


def global_count(x: torch.Tensor | int, device: torch.device) -> int:
    """Sum over ranks of an integer count."""
    t = torch.as_tensor(x, dtype=torch.int64, device=device).reshape(1).clone()
    return int(all_reduce(t))
