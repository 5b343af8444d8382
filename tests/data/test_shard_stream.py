"""WebDataset shards as a resumable stream: a mid-epoch resume continues the epoch."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

from rl_gap.data.image_text import ImageTextDataModule
from rl_gap.data.shard_stream import ResumableStreamLoader, batches_of_worker


def _png(value: int) -> bytes:
    buf = io.BytesIO()
    pixels = np.random.default_rng(value).integers(0, 256, (12, 12, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def write_shards(folder, num_shards: int = 4, per_shard: int = 7, corrupt: str = "") -> str:
    """Tar shards of ``<key>.png`` + ``<key>.txt``; ``corrupt``: a key with a cut image."""
    for s in range(num_shards):
        with tarfile.open(folder / f"shard-{s}.tar", "w") as tar:
            for i in range(per_shard):
                key = f"s{s}i{i}"
                image = _png(100 * s + i)
                members = (("png", image[:40] if key == corrupt else image), ("txt", key.encode()))
                for ext, blob in members:
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(blob)
                    tar.addfile(info, io.BytesIO(blob))
    return str(folder / f"shard-{{0..{num_shards - 1}}}.tar")


def _loader(shards: str, workers: int) -> ResumableStreamLoader:
    data = ImageTextDataModule(
        train_shards=shards, train_num_samples=24, batch_size=3, num_workers=workers,
        image_size=8, shuffle_buffer=4, seed=3,
    )  # fmt: skip
    loader = data.train_dataloader()
    assert isinstance(loader, ResumableStreamLoader)
    return loader


def _epoch(loader, epoch: int, stop: int | None = None) -> list[dict]:
    loader.sampler.set_epoch(epoch)  # what Lightning calls at each epoch start
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == stop:
            break
    return batches


def _same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x["text"] == y["text"] and torch.equal(x["image"], y["image"]) for x, y in zip(a, b)
    )


@pytest.mark.parametrize("workers, corrupt", [(0, ""), (2, "s1i2")])
def test_mid_epoch_resume_continues_the_uninterrupted_epoch(tmp_path, workers, corrupt):
    shards = write_shards(tmp_path, corrupt=corrupt)
    full = _loader(shards, workers)
    epochs = [_epoch(full, 0), _epoch(full, 1)]
    assert len(epochs[0]) == len(full) == 8
    assert [b["text"] for b in epochs[0]] != [b["text"] for b in epochs[1]]  # a new order
    assert not any(corrupt in b["text"] for e in epochs for b in e)
    for stop in (1, 5):
        stopped = _loader(shards, workers)
        head = _epoch(stopped, 0, stop)
        state = stopped.state_dict()
        assert state["epoch"] == 0 and state["batches_done"] == stop
        resumed = _loader(shards, workers)  # a fresh process: new loader, new dataset
        resumed.load_state_dict(state)
        assert _same(head + _epoch(resumed, 0), epochs[0])
        assert _same(_epoch(resumed, 1), epochs[1])


def test_a_finished_epoch_resumes_at_the_next_and_the_workers_must_match(tmp_path):
    shards = write_shards(tmp_path)
    full = _loader(shards, 0)
    first, second = _epoch(full, 0), _epoch(full, 1)
    resumed = _loader(shards, 0)
    resumed.load_state_dict(full.state_dict() | {"epoch": 0, "batches_done": len(first)})
    assert _same(_epoch(resumed, 1), second)
    with pytest.raises(ValueError, match="same num_workers"):
        _loader(shards, 2).load_state_dict({"epoch": 0, "batches_done": 1, "stream_positions": [3]})


def test_the_loader_takes_one_batch_from_each_worker_in_turn():
    # batches 0..6 of 3 workers: worker 0 made 0, 3, 6; worker 1 made 1, 4; worker 2 made 2, 5
    assert [batches_of_worker(7, w, 3) for w in range(3)] == [3, 2, 2]
    assert batches_of_worker(0, 1, 3) == 0


def test_lightning_sets_the_epoch_and_checkpoints_the_position(tmp_path):
    from lightning.fabric.utilities.data import _set_sampler_epoch
    from lightning.fabric.utilities.types import _Stateful

    loader = _loader(write_shards(tmp_path), 0)
    assert isinstance(loader, _Stateful)  # Lightning saves and restores its state_dict
    _set_sampler_epoch(loader, 4)  # what the fit loop calls at each epoch start
    next(iter(loader))
    assert loader.state_dict() == {"epoch": 4, "batches_done": 1, "stream_positions": [3]}
