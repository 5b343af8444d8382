"""Batch samplers: m images per class in every *global* batch, and evaluation sharding.

pytorch-metric-learning's ``MPerClassSampler`` has no DDP version (its #546):
each rank would draw its own classes, so the global batch seen by a gathered
loss would not have m images per class. Here every rank draws the same global
batch from a generator seeded by ``(seed, epoch)`` and keeps its own slice, so
the ranks see disjoint samples, step the same number of batches (DDP would
hang otherwise) and their union is exactly the single-process batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler


def _as_label_tensor(labels: Sequence[int] | torch.Tensor) -> torch.Tensor:
    labels = torch.as_tensor(labels)
    if labels.ndim != 1 or labels.numel() == 0:
        raise ValueError(
            f"labels must be a non-empty 1-D sequence, got shape {tuple(labels.shape)}"
        )
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integers, got {labels.dtype}")
    return labels.long()


class MPerClassBatchSampler(Sampler[list[int]]):
    """Global batches of ``batch_size // m_per_class`` classes x ``m_per_class`` images.

    Each batch picks distinct classes without replacement, with probability
    proportional to class size (so every image is drawn about equally often
    when a batch holds few of the classes, as on SOP or iNaturalist),
    and takes the next ``m_per_class`` images from that class's shuffled queue
    (reshuffled when fewer than m remain). A class with fewer than m images
    repeats some of them to fill its m slots.

    Args:
        labels: (N,) integer class label of every dataset item.
        batch_size: *global* batch size (all ranks together); a multiple of
            ``m_per_class`` and of ``num_replicas``.
        m_per_class: images per class in a global batch.
        num_replicas: number of ranks (``trainer.world_size``); rank ``r`` yields
            items ``[r*b, (r+1)*b)`` of each global batch, ``b = batch_size // num_replicas``.
        rank: this process's rank.
        seed: base seed; batches depend only on ``(seed, epoch)``.
        batches_per_epoch: default ``N // batch_size`` (about one pass over the data).
    """

    def __init__(
        self,
        labels: Sequence[int] | torch.Tensor,
        batch_size: int,
        m_per_class: int,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        batches_per_epoch: int | None = None,
    ) -> None:
        labels = _as_label_tensor(labels)
        if m_per_class < 1 or batch_size < 1:
            raise ValueError(
                f"batch_size ({batch_size}) and m_per_class ({m_per_class}) must be >= 1"
            )
        if batch_size % m_per_class:
            raise ValueError(
                f"batch_size {batch_size} is not a multiple of m_per_class {m_per_class}"
            )
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"invalid rank {rank} for num_replicas {num_replicas}")
        if batch_size % num_replicas:
            raise ValueError(
                f"global batch_size {batch_size} is not divisible by the {num_replicas} ranks"
            )
        classes, inverse = torch.unique(labels, return_inverse=True)
        self.classes_per_batch = batch_size // m_per_class
        if self.classes_per_batch > len(classes):
            raise ValueError(
                f"a batch of {batch_size} with {m_per_class} per class needs "
                f"{self.classes_per_batch} classes but the dataset has {len(classes)}"
            )
        order = torch.argsort(inverse, stable=True)
        counts = torch.bincount(inverse, minlength=len(classes))
        self.members = list(torch.split(order, counts.tolist()))
        self.class_weights = counts.double()
        self.batch_size = batch_size
        self.m_per_class = m_per_class
        self.num_replicas = num_replicas
        self.rank = rank
        self.seed = seed
        self.epoch = 0
        self.num_batches = batches_per_epoch or max(1, len(labels) // batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning at every epoch start: new batches, same on every rank."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_batches

    def global_batches(self) -> Iterator[list[int]]:
        """The epoch's global batches (identical on every rank)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        queues: list[list[int]] = [[] for _ in self.members]
        m = self.m_per_class
        for _ in range(self.num_batches):
            chosen = torch.multinomial(
                self.class_weights, self.classes_per_batch, replacement=False, generator=g
            )
            batch: list[int] = []
            for c in chosen.tolist():
                members = self.members[c]
                if len(members) < m:  # small class: all of it, then repeats
                    fill = torch.randint(len(members), (m - len(members),), generator=g)
                    batch += members.tolist() + members[fill].tolist()
                    continue
                if len(queues[c]) < m:
                    queues[c] = members[torch.randperm(len(members), generator=g)].tolist()
                batch += queues[c][:m]
                del queues[c][:m]
            yield batch

    def __iter__(self) -> Iterator[list[int]]:
        local = self.batch_size // self.num_replicas
        start = self.rank * local
        for batch in self.global_batches():
            yield batch[start : start + local]


class ShardSampler(Sampler[int]):
    """Evaluation sharding without padding: rank ``r`` gets items ``r, r + W, r + 2W, ...``.

    Unlike ``DistributedSampler`` no item is duplicated, so metrics over the
    gathered embeddings count every item once.
    """

    def __init__(self, num_items: int, num_replicas: int = 1, rank: int = 0) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"invalid rank {rank} for num_replicas {num_replicas}")
        self.num_items, self.num_replicas, self.rank = num_items, num_replicas, rank

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.num_items, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.num_items, self.num_replicas))
