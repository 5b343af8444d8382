"""Sharded evaluation: processes split the engine's GEMM blocks and sum its exact counts.

Every process holds the same embeddings and labels (the gathered evaluation set)
and passes the same ``Shard`` description to ``state_from_embeddings`` /
``evaluate_embeddings``. The engine then scores and counts only the blocks it
owns (block id modulo the world size), with the very block shapes one process
would use, so every score, and every tie, is the one-process value. Two sums over
the processes make the state exact on every process:

1. the positive scores (each filled in by the owner of its block, zero elsewhere:
   ``x + 0 = x`` exactly), from which every process builds the same grid;
2. the integer histograms of the negative counter (per group on the grid, per
   query at its own positives, bootstrap knots): counts add up over blocks.

Each process then holds the one-process state, so every metric (gAP, R@P, F1g,
the threshold protocol's fitted thresholds, distractor queries) is identical.
Communication is O(P + groups·G + own positives) per evaluation, not O(Q·D).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from torch import Tensor

from rl_gap import dist

__all__ = ["Shard", "process_group_shard"]


@dataclass(frozen=True)
class Shard:
    """This process's share of the engine's blocks.

    Args:
        rank: this process, in [0, world).
        world: number of processes, >= 1.
        all_reduce: in-place sum of a tensor over the processes (every process
            calls it in the same order with tensors of the same shape and dtype).
    """

    rank: int
    world: int
    all_reduce: Callable[[Tensor], object]

    def __post_init__(self) -> None:
        if isinstance(self.world, bool) or not isinstance(self.world, int) or self.world < 1:
            raise ValueError(f"shard world must be an integer >= 1, got {self.world!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int):
            raise ValueError(f"shard rank must be an integer, got {self.rank!r}")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"shard rank must be in [0, {self.world}), got {self.rank}")

    def owns(self, block_id: int) -> bool:
        """Whether this process scores and counts block ``block_id``."""
        return block_id % self.world == self.rank


def process_group_shard(group=None) -> Shard | None:
    """The shard of this process in an initialised ``torch.distributed`` group
    (None without one, or on a single process). Tensors summed through it must
    suit the backend (CPU for gloo, CUDA for NCCL): the engine's live on the
    scoring device."""
    import torch.distributed as torch_dist

    if not dist.is_distributed():
        return None
    world = torch_dist.get_world_size(group)
    if world == 1:
        return None
    return Shard(torch_dist.get_rank(group), world, partial(dist.all_reduce, op="sum", group=group))


def merge_sum(tensors: list[Tensor], shard: Shard) -> None:
    """Sum same-dtype tensors over the processes in one collective (in place)."""
    dist.all_reduce_flat(tensors, shard.all_reduce)
