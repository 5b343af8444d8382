"""Every collective of rl_gap: rank/world, gathers, all-reduces and a byte counter.

Used by the modules (the global batch), the sharded losses (``losses/sharding/``)
and the sharded metric engine (``metrics/functional/sharding.py``); every call goes
through ``torch.distributed`` module attributes, so one patch of them sees them all.

Gathers. ``all_gather_ragged`` concatenates every rank's rows in rank order (ranks
may hold different numbers of rows: each pads to the largest, the padding is cut
off). ``gather_with_grad`` is its differentiable form: in backward each rank sums
(all-reduce) the gradient that every rank's identical global loss assigns to its
slice. Lightning/DDP then *averages* parameter gradients over ranks, so the W-fold
sum and the 1/W average cancel and the update equals that of one process holding
the whole batch (the factor open_clip #616 and lightly #1531 got wrong).

Reductions with autograd, for sharded losses (docs/definitions.md, "Sharded losses"):
a sharded loss sees only this rank's consecutive block of rows of the global (B, M)
matrix; its value is built from *global statistics* (sums over ranks of local
partials) and a final sum of local partial losses.

- ``reduce_statistic(t)``: forward all-reduce (sum); backward all-reduce (sum).
  Every rank consumes the global statistic in a *different* local term, so the
  gradient of the statistic is the sum over ranks of those terms'.
- ``reduce_partials(t)``: forward all-reduce (sum); backward identity. The result is
  the loss itself, one value held by every rank; its upstream gradient is that of the
  same scalar on every rank, so each rank passes it to its own partial unchanged.
- ``first_rank_only(t)``: a term that is the same on every rank enters the partial
  sum on rank 0 alone, so it is counted once.
(``torch.distributed.all_reduce`` has no backward; lightly #1920.)

``COUNTER`` adds the bytes this rank contributes to the collectives of the sharded
losses and the sharded metric engine (``all_reduce``, ``all_gather_sizes``,
``all_gather_ragged`` and the reductions: the tensor put into an all-reduce, or its
own part of an all-gather; a ring all-reduce sends at most twice that). The batch
gathers of the modules (``gather_with_grad``, ``gather_no_grad``, ``local_slice``)
are the same for either loss path and are not counted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = [
    "is_distributed",
    "world_size",
    "rank",
    "require_group",
    "CommCounter",
    "COUNTER",
    "counting",
    "all_reduce",
    "all_reduce_flat",
    "all_gather_sizes",
    "all_gather_ragged",
    "gather_with_grad",
    "gather_no_grad",
    "unique_by_index",
    "local_slice",
    "reduce_statistic",
    "reduce_partials",
    "scale_grad",
    "first_rank_only",
    "global_count",
]


# ---------------------------------------------------------------- rank and world
def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def require_group() -> tuple[int, int]:
    """(rank, world size) of the default process group; clear error without one."""
    if not is_distributed():
        raise RuntimeError(
            "a sharded loss call (sharded=True) needs an initialised torch.distributed "
            "process group; call the loss without sharded=True on one process"
        )
    return dist.get_rank(), dist.get_world_size()


# ---------------------------------------------------------------- byte counter
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


# ---------------------------------------------------------------- all-reduce
_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


def all_reduce(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """In-place all-reduce (``sum``, ``max`` or ``min``) without autograd; returns ``tensor``."""
    if op not in _OPS:
        raise ValueError(f"all_reduce op must be one of {sorted(_OPS)}, got {op!r}")
    COUNTER.add(tensor)
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, _OPS[op]), group=group)
    return tensor


def all_reduce_flat(tensors: Sequence[torch.Tensor], reduce=None) -> None:
    """Sum same-dtype tensors over the processes in one collective, in place.

    ``reduce``: the in-place sum of one flat tensor (default ``all_reduce``)."""
    tensors = [t for t in tensors if t.numel()]
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    (reduce or all_reduce)(flat)
    start = 0
    for t in tensors:
        t.copy_(flat[start : start + t.numel()].view_as(t))
        start += t.numel()


def global_count(x: torch.Tensor | int, device: torch.device) -> int:
    """Sum over ranks of an integer count."""
    t = torch.as_tensor(x, dtype=torch.int64, device=device).reshape(1).clone()
    return int(all_reduce(t))


# ---------------------------------------------------------------- all-gather
def _sizes(n: int, device: torch.device, count: bool) -> list[int]:
    size = torch.tensor([n], dtype=torch.int64, device=device)
    parts = [torch.empty_like(size) for _ in range(world_size())]
    if count:
        COUNTER.add(size)
    dist.all_gather(parts, size)
    return [int(p) for p in parts]


def _gather_parts(x: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """Every rank's rows (rank order): padded to the largest rank's, gathered, cut."""
    pad = max(sizes) - x.shape[0]
    padded = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))]) if pad else x.contiguous()
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return [p[:n] for p, n in zip(parts, sizes)]


def all_gather_sizes(n: int, device: torch.device) -> list[int]:
    """Every rank's ``n`` (rank order)."""
    require_group()
    return _sizes(n, device, count=True)


def all_gather_ragged(x: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
    """Concatenate every rank's ``x`` (n_r, ...) along dim 0 in rank order, no autograd.

    ``sizes``: every rank's ``n_r`` when already known (saves one collective)."""
    sizes = all_gather_sizes(x.shape[0], x.device) if sizes is None else sizes
    COUNTER.add(x)
    return torch.cat(_gather_parts(x, sizes))


class _GatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.sizes = _sizes(x.shape[0], x.device, count=False)
        return torch.cat(_gather_parts(x, ctx.sizes))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        # A private contiguous copy: all_reduce works in place and the incoming
        # gradient buffer may be shared with other autograd consumers.
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        start = sum(ctx.sizes[: rank()])
        return grad[start : start + ctx.sizes[rank()]]


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` (N_r, ...) over ranks along dim 0, differentiably.

    Identity when not distributed.
    """
    if world_size() == 1:
        return x
    return _GatherWithGrad.apply(x)


@torch.no_grad()
def gather_no_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` over ranks along dim 0 (labels, ids, frozen keys)."""
    if world_size() == 1:
        return x
    return torch.cat(_gather_parts(x, _sizes(x.shape[0], x.device, count=False)))


def unique_by_index(index: torch.Tensor, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Rows of ``values`` sorted by the (N,) dataset ``index``, one per distinct index.

    A padding sampler (``DistributedSampler``) repeats items so that every rank gets as
    many; after a gather each item must count once. The first copy of an index is kept.

    Args:
        index: (N,) integer dataset index of each row.
        *values: tensors with N rows (pass ``index`` again to get the kept indices).

    Returns:
        One tensor per ``values``, (U, ...) for the U distinct indices in increasing order.
    """
    order = torch.argsort(index, stable=True)
    index = index[order]
    keep = torch.ones_like(index, dtype=torch.bool)
    keep[1:] = index[1:] != index[:-1]
    order = order[keep]
    return tuple(v[order] for v in values)


def local_slice(n_local: int, device: torch.device | None = None) -> slice:
    """Rows of the gathered global batch that belong to this rank."""
    if world_size() == 1:
        return slice(0, n_local)
    sizes = _sizes(n_local, device or torch.device("cpu"), count=False)
    start = sum(sizes[: rank()])
    return slice(start, start + n_local)


# ---------------------------------------------------------------- autograd reductions
class _ReduceStatistic(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return all_reduce(x.detach().clone(memory_format=torch.contiguous_format))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return all_reduce(grad.clone(memory_format=torch.contiguous_format))


class _ReducePartials(_ReduceStatistic):
    """The same sum forward; backward hands each rank its own share's gradient unchanged."""

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
    rank_, _ = require_group()
    return x if rank_ == 0 else x * 0.0
