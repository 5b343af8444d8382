"""Shuffled training batches with a checkpointable position and per-item seeded augmentation.

What the MoCo v3 and CLIP data modules train on, so that a run resumed mid-epoch from a
step or SIGTERM checkpoint sees exactly the batches *and the augmented views* the
uninterrupted run would:

- :class:`ShuffledBatchSampler`: every rank draws the same permutation from a generator
  seeded by ``(seed, epoch)`` (a ``DistributedSampler`` with ``drop_last``), cuts it into
  global batches and keeps its own slice; ``resume(epoch, batches_done)`` skips the
  batches a checkpoint already trained on. Used through
  :class:`rl_gap.data.sampler.ResumableBatchLoader`, whose position Lightning checkpoints.
- Each item is handed to the dataset as ``(index, item_seed)``, the seed a function of
  ``(seed, epoch, index)`` only; :class:`SeededItems` runs the wrapped dataset's random
  transforms under that seed (torch's and Python's generators, restored afterwards). The
  views therefore do not depend on the process, the number of DataLoader workers or on
  what ran before: a resumed run draws the same ones.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler

from rl_gap.data.sampler import ResumableBatchLoader, ResumableEpochs

_ITEM_SEED_MOD = 2**63 - 1


def item_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of item ``index``'s augmentation in ``epoch`` (a fixed mix, same on every host)."""
    x = (int(seed) * 1_000_003 + int(epoch)) * 2_147_483_659 + int(index)
    x = (x ^ (x >> 31)) * 0x9E3779B97F4A7C15
    return (x ^ (x >> 29)) % _ITEM_SEED_MOD


class ShuffledBatchSampler(ResumableEpochs, Sampler[list[tuple[int, int]]]):
    """Shuffled global batches of ``batch_size * num_replicas`` items; this rank's slice of each.

    Args:
        num_items: dataset size.
        batch_size: per-rank batch (the modules' ``batch_size``, as with a DataLoader).
        num_replicas, rank: the ranks and this one (1, 0 without DDP).
        seed: permutation and augmentation seed; batches depend only on ``(seed, epoch)``.
        batches_per_epoch: batches per epoch (default: as many full global batches as the
            data holds); more than that continues with further seeded permutations.

    The ragged last global batch is dropped (every step sees full batches on every rank).
    """

    def __init__(
        self,
        num_items: int,
        batch_size: int,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        batches_per_epoch: int | None = None,
    ) -> None:
        if batch_size < 1 or num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(
                f"invalid batch_size {batch_size} / rank {rank} of {num_replicas} replicas"
            )
        global_batch = batch_size * num_replicas
        if num_items < global_batch:
            raise ValueError(
                f"{num_items} training items cannot fill one global batch of {global_batch} "
                f"({batch_size} x {num_replicas} ranks); incomplete batches are dropped"
            )
        self.num_items, self.batch_size = int(num_items), int(batch_size)
        self.num_replicas, self.rank, self.seed = int(num_replicas), int(rank), int(seed)
        num_batches = self.num_items // global_batch
        if batches_per_epoch is not None:
            if isinstance(batches_per_epoch, bool) or batches_per_epoch < 1:
                raise ValueError(f"batches_per_epoch must be >= 1, got {batches_per_epoch}")
            num_batches = int(batches_per_epoch)
        self._start_epochs(num_batches)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch, skip = self._begin_iteration()
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        global_batch = self.batch_size * self.num_replicas
        order: list[int] = []
        while len(order) < self.num_batches * global_batch:  # one permutation unless asked more
            order += torch.randperm(self.num_items, generator=g).tolist()
        start = self.rank * self.batch_size
        for b in range(skip, self.num_batches):
            mine = order[b * global_batch + start : b * global_batch + start + self.batch_size]
            yield [(i, item_seed(self.seed, epoch, i)) for i in mine]


class SeededItems(Dataset):
    """``dataset[(index, seed)]``: ``base[index]`` with its random transforms seeded by ``seed``.

    A plain integer index reads ``base[index]`` as is (unseeded). The global torch and
    Python generators are restored after each item, so nothing else sees the seeding.
    """

    def __init__(self, base: Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, key: int | tuple[int, int]) -> Any:
        if not isinstance(key, tuple):
            return self.base[key]
        index, seed = key
        state = random.getstate()
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                random.seed(seed)
                return self.base[index]
        finally:
            random.setstate(state)

    def __getattr__(self, name: str) -> Any:
        if name == "base":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.base, name)


def per_device_batch(datamodule: Any, global_batch: int) -> int:
    """The share of ``global_batch`` each rank of ``datamodule.trainer`` loads (one line if the
    ranks cannot share it evenly)."""
    trainer = getattr(datamodule, "trainer", None)
    world = trainer.world_size if trainer is not None else 1
    if global_batch % world:
        raise ValueError(
            f"data.batch_size {global_batch} is the global batch and must be divisible by the "
            f"{world} ranks (devices x nodes); use a multiple of {world}"
        )
    return global_batch // world


def check_batching(batch_size: int, batches_per_epoch: int | None) -> None:
    """Refuse a global ``batch_size`` below 1 and a ``batches_per_epoch`` below 1 (None: as
    many full global batches as the data holds), each in one line naming the setting."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if batches_per_epoch is not None and batches_per_epoch < 1:
        raise ValueError(f"batches_per_epoch must be >= 1 or None, got {batches_per_epoch}")


def resumable_train_loader(
    datamodule: Any,
    dataset: Dataset,
    batch_size: int,
    seed: int,
    batches_per_epoch: int | None = None,
    **loader_kwargs: Any,
) -> Any:
    """A :class:`~rl_gap.data.sampler.ResumableBatchLoader` of shuffled, seeded batches.

    The ranks come from ``datamodule.trainer`` (1, 0 without one). Under DDP the loader
    shards the batches itself: the trainer needs ``use_distributed_sampler=False``
    (``rl-gap fit`` sets it for data modules with ``shards_training_batches``).
    """
    trainer = getattr(datamodule, "trainer", None)
    world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
    if world > 1 and trainer._accelerator_connector.use_distributed_sampler:
        raise ValueError(
            "set trainer.use_distributed_sampler=false: the resumable training loader "
            "already gives every rank its own slice of each global batch"
        )
    sampler = ShuffledBatchSampler(
        len(dataset),
        batch_size,
        world,
        rank,
        seed,
        batches_per_epoch,  # type: ignore[arg-type]
    )
    return ResumableBatchLoader(SeededItems(dataset), batch_sampler=sampler, **loader_kwargs)
