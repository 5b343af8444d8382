"""WebDataset tar shards as a resumable stream: an epoch is a function of ``(seed, epoch)``.

Reader ``j`` (``rank * workers + worker``) of ``R`` reads, in epoch ``e``:

- shards: a permutation of the shard list drawn from ``(seed, e)``, its ``j``-th of every
  ``R`` shards, cycled (``resampled``: shards drawn with replacement from
  ``(seed, e, j)``);
- samples: the members of each shard grouped by key (``webdataset``'s tar reader), those
  with an image (``jpg``/``jpeg``/``png``/``webp``) and a ``txt`` caption, through a
  shuffle buffer seeded by ``(seed, e, j)``, cut after ``samples_per_worker``;
- views: each sample's random transforms seeded by ``(seed, e, position)``
  (``resumable.item_seed``), whatever the process or worker.

An image that cannot be decoded is logged and skipped; the worker reads on until it
has yielded its samples (whole batches on every rank). ``ResumableStreamLoader``
records, per worker, how many stream samples its served batches used (corrupt ones
included); a resumed loader has each worker read past them (reading, not decoding),
so the rest of the epoch is the uninterrupted run's.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from rl_gap.data.resumable import item_seed

logger = logging.getLogger(__name__)


def skip_corrupt_sample(error: Exception) -> bool:
    """WebDataset error handler: log the bad sample (shard and key in the message) and go on."""
    logger.warning("WebDataset: skipping a sample: %s", error)
    return True


__all__ = ["ResumableStreamLoader", "ShardStream", "batches_of_worker"]

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")


def _mix(*values: int) -> int:
    """One 63-bit seed from integers (``item_seed``'s mix, chained)."""
    seed = 0
    for value in values:
        seed = item_seed(seed, 0, int(value))
    return seed


def batches_of_worker(batches_done: int, worker: int, workers: int) -> int:
    """Batches worker ``worker`` produced among the loader's first ``batches_done`` (a
    DataLoader over an iterable dataset takes one batch from each worker in turn)."""
    return len(range(worker, batches_done, workers))


def logical_worker(info) -> int:
    """The reader a DataLoader worker plays: a loader resumed after ``n`` batches asks
    its worker 0 first, which then plays worker ``n % workers`` of the uninterrupted run."""
    if info is None:
        return 0
    return (info.id + info.dataset.worker_offset) % info.num_workers


class ShardStream(IterableDataset):
    """Samples ``to_sample(raw)`` from tar shards, whole batches per worker (module docstring).

    Args:
        urls: shard paths or URLs (``webdataset.gopen`` opens them).
        to_sample: ``raw sample dict -> training sample``; a ``ValueError`` marks an
            undecodable image.
        samples_per_worker: samples each reader yields per epoch (a multiple of ``batch_size``).
        batch_size, workers, world_size, rank: the loader's batch, its DataLoader workers
            (1 without), the ranks and this one (None: ``torch.distributed``'s).
        resampled, shuffle_buffer, seed: as in ``webdataset_pairs``.
    """

    def __init__(
        self,
        urls: Sequence[str],
        to_sample: Callable[[dict[str, Any]], dict[str, Any]],
        samples_per_worker: int,
        batch_size: int,
        workers: int = 1,
        world_size: int = 1,
        rank: int | None = None,
        resampled: bool = False,
        shuffle_buffer: int = 2000,
        seed: int = 0,
    ) -> None:
        self.urls, self.to_sample = list(urls), to_sample
        self.samples_per_worker, self.batch_size = int(samples_per_worker), int(batch_size)
        self.workers, self.world_size, self.rank = max(1, int(workers)), int(world_size), rank
        self.resampled, self.shuffle_buffer, self.seed = resampled, int(shuffle_buffer), int(seed)
        # where to start, set by the loader before each iteration
        self.epoch, self.skip_batches = 0, 0
        self.skip_positions: list[int] | None = None
        self.worker_offset = 0  # ``logical_worker``
        self.with_positions = False  # ``__position__`` in each sample (the loader's collate)

    def __len__(self) -> int:
        return self.samples_per_worker * self.workers

    def _reader(self) -> int:
        info = get_worker_info()
        rank = self.rank
        if rank is None:
            dist = torch.distributed
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return int(rank) * self.workers + logical_worker(info)

    def _shards(self, reader: int, epoch: int) -> Iterator[str]:
        readers = self.world_size * self.workers
        if self.resampled:
            rng = random.Random(_mix(self.seed, epoch, reader))
            while True:
                yield self.urls[rng.randrange(len(self.urls))]
        g = torch.Generator().manual_seed(_mix(self.seed, epoch))
        order = torch.randperm(len(self.urls), generator=g).tolist()
        mine = [self.urls[i] for i in order[reader::readers]]
        if not mine:
            raise ValueError(f"reader {reader} of {readers} has no shard ({len(self.urls)} shards)")
        yield from itertools.cycle(mine)

    def _raw(self, reader: int, epoch: int) -> Iterator[dict[str, Any]]:
        """Grouped tar members with an image and a caption, shuffled (seeded buffer)."""
        from webdataset.tariterators import tarfile_samples

        samples = (
            raw
            for url in self._shards(reader, epoch)
            for raw in tarfile_samples(iter([{"url": url}]), handler=skip_corrupt_sample)
            if "txt" in raw and any(key in raw for key in IMAGE_KEYS)
        )
        if self.shuffle_buffer <= 1:
            yield from samples
            return
        rng, buffer = random.Random(_mix(self.seed, epoch, reader, 1)), []
        for raw in samples:
            if len(buffer) < self.shuffle_buffer:
                buffer.append(raw)
                continue
            k = rng.randrange(len(buffer))
            yield buffer[k]
            buffer[k] = raw
        rng.shuffle(buffer)
        yield from buffer

    def _decoded(self, raw: dict[str, Any], seed: int) -> dict[str, Any]:
        state = random.getstate()
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                random.seed(seed)
                return self.to_sample(raw)
        finally:
            random.setstate(state)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """This reader's samples of ``self.epoch``, each with ``__position__``: the stream
        samples read through it (after ``skip_positions[worker]`` read past, and
        ``skip_batches`` of the loader already served)."""
        reader, epoch = self._reader(), self.epoch
        worker = reader % self.workers
        done = batches_of_worker(self.skip_batches, worker, self.workers) * self.batch_size
        skip = done if self.skip_positions is None else int(self.skip_positions[worker])
        stream = itertools.islice(self._raw(reader, epoch), skip, None)
        for position, raw in enumerate(stream, start=skip):
            if done >= self.samples_per_worker:
                return
            seed = item_seed(self.seed, epoch, reader * self.samples_per_worker + position)
            try:
                sample = self._decoded(raw, seed)
            except ValueError as error:  # logged with the shard and key, then skipped
                skip_corrupt_sample(error)
                continue
            done += 1
            yield sample | {"__position__": position + 1} if self.with_positions else sample


class _PositionCollate:
    """``collate(samples)`` and ``(worker, stream position after the batch)`` (picklable)."""

    def __init__(self, collate: Callable[[list[Any]], Any]) -> None:
        self.collate = collate

    def __call__(self, samples: list[dict[str, Any]]) -> tuple[Any, tuple[int, int]]:
        end = max(sample.pop("__position__") for sample in samples)
        return self.collate(samples), (logical_worker(get_worker_info()), end)


class ResumableStreamLoader(DataLoader):
    """Training loader of a ``ShardStream`` with a checkpointable position.

    ``state_dict()``: ``{"epoch", "batches_done", "stream_positions"}`` (batches served
    to the training loop; stream samples each worker read for them); after
    ``load_state_dict`` the next iteration of that epoch continues there. The epoch
    comes from Lightning's ``set_epoch`` (forwarded from ``loader.sampler``) or counts
    iterations. Workers start per epoch, so each reads the position.
    """

    def __init__(self, dataset: ShardStream, **kwargs: Any) -> None:
        from torch.utils.data import default_collate

        for fixed in ("persistent_workers", "batch_size", "drop_last"):  # set here
            kwargs.pop(fixed, None)
        collate = kwargs.pop("collate_fn", None) or default_collate
        if not isinstance(collate, _PositionCollate):  # not wrapped twice when re-built
            collate = _PositionCollate(collate)
        super().__init__(
            dataset, batch_size=dataset.batch_size, drop_last=True, collate_fn=collate, **kwargs
        )
        self.sampler.set_epoch = self.set_epoch  # torch's placeholder sampler of a stream
        self._epoch, self._pending = 0, None
        self._run: tuple[int, int, list[int]] | None = None  # epoch, batches, positions

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where the next batch of the training loop is."""
        if self._run is None:
            workers = self.dataset.workers
            return {"epoch": self._epoch, "batches_done": 0, "stream_positions": [0] * workers}
        epoch, done, positions = self._run
        return {"epoch": epoch, "batches_done": done, "stream_positions": list(positions)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a ``state_dict`` (Lightning calls it when resuming)."""
        missing = {"epoch", "batches_done"} - set(state)
        if missing:
            raise KeyError(f"loader state lacks {sorted(missing)}: got {sorted(state)}")
        epoch, done = int(state["epoch"]), int(state["batches_done"])
        positions = state.get("stream_positions")
        if epoch < 0 or done < 0:
            raise ValueError(f"invalid resume position epoch={epoch}, batches={done}")
        if positions is not None and len(positions) != self.dataset.workers:
            raise ValueError(
                f"the checkpoint's stream has {len(positions)} worker(s), this loader "
                f"{self.dataset.workers}: resume with the same num_workers"
            )
        if done >= len(self):  # a finished epoch: the next one starts
            epoch, done, positions = epoch + 1, 0, None
        self._epoch, self._pending = epoch, (epoch, done, positions)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        epoch, done, positions = self._epoch, 0, None
        if self._pending is not None:
            if self._pending[0] == epoch:
                done, positions = self._pending[1], self._pending[2]
            self._pending = None
        dataset = self.dataset
        dataset.with_positions, dataset.worker_offset = True, done % dataset.workers
        dataset.epoch, dataset.skip_batches, dataset.skip_positions = epoch, done, positions
        if positions is None:
            positions = [
                batches_of_worker(done, w, dataset.workers) * dataset.batch_size
                for w in range(dataset.workers)
            ]
        self._run = (epoch, done, list(positions))
        self._epoch = epoch + 1  # without set_epoch, the next iteration is the next epoch
        for batch, (worker, end) in DataLoader.__iter__(self):
            epoch, done, positions = self._run
            positions[worker] = end
            self._run = (epoch, done + 1, positions)
            yield batch
