"""Batch samplers: m images per class in every *global* batch, and evaluation sharding.

pytorch-metric-learning's ``MPerClassSampler`` has no DDP version (its #546):
each rank would draw its own classes, so the global batch seen by a gathered
loss would not have m images per class. Here every rank draws the same global
batch from a generator seeded by ``(seed, epoch)`` and keeps its own slice, so
the ranks see disjoint samples, step the same number of batches (DDP would
hang otherwise) and their union is exactly the single-process batch.

Resuming mid-epoch: :class:`ResumableBatchLoader` is the training DataLoader
over that sampler; Lightning stores its ``state_dict()`` (the epoch and the
number of batches the training loop consumed) in every checkpoint and hands it
back through ``load_state_dict`` before iterating again, so a run resumed from a
step or SIGTERM checkpoint sees exactly the batches the uninterrupted run would.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler


def _as_label_tensor(labels: Sequence[int] | torch.Tensor) -> torch.Tensor:
    labels = torch.as_tensor(labels)
    if labels.ndim != 1 or labels.numel() == 0:
        raise ValueError(
            f"labels must be a non-empty 1-D sequence, got shape {tuple(labels.shape)}"
        )
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integers, got {labels.dtype}")
    return labels.long()


class _EpochForwarder:
    """``set_epoch`` target handed to Lightning as ``batch_sampler.sampler``."""

    def __init__(self, owner: ResumableEpochs) -> None:
        self.owner = owner

    def set_epoch(self, epoch: int) -> None:
        self.owner.set_epoch(epoch)


class ResumableEpochs:
    """The epoch and resume position every resumable batch sampler keeps.

    A subclass calls :meth:`_start_epochs` in ``__init__`` and :meth:`_begin_iteration` at
    the start of ``__iter__``: it applies ``_pending`` (``(epoch, batches to skip)`` restored
    from a checkpoint) and records ``position`` (``(epoch, first batch)`` of the running
    iteration), which :class:`ResumableBatchLoader` checkpoints.
    """

    epoch: int
    num_batches: int
    _pending: tuple[int, int] | None
    position: tuple[int, int]

    def _start_epochs(self, num_batches: int) -> None:
        self.epoch = 0
        self.num_batches = int(num_batches)
        self._pending = None
        self.position = (0, 0)

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning at every epoch start: new batches, same on every rank."""
        self.epoch = int(epoch)

    @property
    def sampler(self) -> _EpochForwarder:
        """Lightning calls ``set_epoch`` on ``loader.sampler`` and ``loader.batch_sampler.sampler``
        only (never on the batch sampler itself); this forwards the call here, so
        every epoch draws new batches."""
        return _EpochForwarder(self)

    def resume(self, epoch: int, batches_done: int) -> None:
        """Make the next iteration continue ``epoch`` after its first ``batches_done`` batches.

        Applied only if that iteration runs ``epoch`` (after a checkpoint taken at
        the end of an epoch Lightning moves on with ``set_epoch(epoch + 1)``, and
        the next epoch starts from its first batch).
        """
        if epoch < 0 or batches_done < 0:
            raise ValueError(f"invalid resume position epoch={epoch}, batches={batches_done}")
        self.epoch = int(epoch)
        self._pending = (int(epoch), int(batches_done))

    def __len__(self) -> int:
        return self.num_batches

    def _begin_iteration(self) -> tuple[int, int]:
        """``(epoch, batches to skip)`` of a new iteration: a restored position applies to
        the epoch it was saved in only, and is used once; recorded as ``position``."""
        epoch, skip = self.epoch, 0
        if self._pending is not None:
            if self._pending[0] == epoch:
                skip = self._pending[1]
            self._pending = None
        self.position = (epoch, skip)
        return epoch, skip


class MPerClassBatchSampler(ResumableEpochs, Sampler[list[int]]):
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
        small = counts < m_per_class
        if bool(small.any()) and rank == 0:
            warnings.warn(
                f"m_per_class {m_per_class} is larger than {int(small.sum())} of the "
                f"{len(classes)} classes (smallest: {int(counts.min())} images): a batch that "
                "draws such a class repeats its images to fill it (positives that are the same "
                "image); lower m_per_class or drop the small classes",
                UserWarning,
                stacklevel=2,
            )
        self.members = list(torch.split(order, counts.tolist()))
        self.class_weights = counts.double()
        self.batch_size = batch_size
        self.m_per_class = m_per_class
        self.num_replicas = num_replicas
        self.rank = rank
        self.seed = seed
        self._start_epochs(batches_per_epoch or max(1, len(labels) // batch_size))

    def global_batches(self, epoch: int | None = None) -> Iterator[list[int]]:
        """The global batches of ``epoch`` (default ``self.epoch``), identical on every rank."""
        epoch = self.epoch if epoch is None else epoch
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
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
        # a generator: this body runs at the first ``next``, after Lightning's ``set_epoch``
        epoch, skip = self._begin_iteration()
        local = self.batch_size // self.num_replicas
        start = self.rank * local
        for i, batch in enumerate(self.global_batches(epoch)):
            if i >= skip:  # skipped batches are still drawn: the generator state must match
                yield batch[start : start + local]


class _CountingIterator:
    """Creates the DataLoader's iterator at the first ``next`` and counts what it served."""

    def __init__(self, loader: ResumableBatchLoader) -> None:
        self.loader = loader
        self.inner: Iterator[Any] | None = None

    def __iter__(self) -> _CountingIterator:
        return self

    def __next__(self) -> Any:
        if self.inner is None:
            # created lazily so that worker prefetching draws batches only after set_epoch
            self.inner = DataLoader.__iter__(self.loader)
        batch = next(self.inner)
        run = self.loader._run
        if run is None:  # the sampler has started this iteration: its position is known
            epoch, start = self.loader.batch_sampler.position
            run = self.loader._run = [epoch, start, 0]
        run[2] += 1
        return batch


class ResumableBatchLoader(DataLoader):
    """Training DataLoader over a :class:`MPerClassBatchSampler` (or any batch sampler with
    ``epoch``, ``position`` and ``resume``, e.g. ``rl_gap.data.resumable.ShuffledBatchSampler``)
    with a checkpointable position.

    Lightning saves ``state_dict()`` with the training loop's state (any loader
    with ``state_dict``/``load_state_dict``) and calls ``load_state_dict`` before
    the resumed run iterates. The count is of batches *served to the training
    loop* (worker prefetching does not inflate it), so it equals the loop's
    finished steps of the epoch whenever a checkpoint is written after a step.
    Constructed like a ``DataLoader`` with ``batch_sampler=MPerClassBatchSampler(...)``.
    """

    _run: list[int] | None = None  # [epoch, first batch, batches served] of the current iteration

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if not all(hasattr(self.batch_sampler, a) for a in ("resume", "position", "epoch")):
            raise TypeError(
                "ResumableBatchLoader needs a batch sampler with a resumable position "
                "(MPerClassBatchSampler, rl_gap.data.resumable.ShuffledBatchSampler), got "
                f"{type(self.batch_sampler).__name__}"
            )
        self._run = None
        return _CountingIterator(self)

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "batches_done"}``: where the next batch of the training loop is."""
        if self._run is None:
            sampler = self.batch_sampler
            return {"epoch": int(getattr(sampler, "epoch", 0)), "batches_done": 0}
        epoch, start, served = self._run
        return {"epoch": epoch, "batches_done": start + served}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a :meth:`state_dict` (called by Lightning when resuming)."""
        missing = {"epoch", "batches_done"} - set(state)
        if missing:
            raise KeyError(f"loader state lacks {sorted(missing)}: got {sorted(state)}")
        self.batch_sampler.resume(int(state["epoch"]), int(state["batches_done"]))


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
