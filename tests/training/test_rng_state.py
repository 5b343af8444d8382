# ruff: noqa: NPY002

"""The random streams a checkpoint holds: saved, restored, loadable with weights_only=True;
a training loader's iterator draws its workers' seeds from its own (seed, epoch) generator."""

from __future__ import annotations

import io
import random

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from rl_gap.training.rng_state import ResumeRandomState, capture_streams, restore_streams


def _draw():
    return (torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)])


def test_streams_round_trip_through_a_weights_only_checkpoint():
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    _draw()
    buffer = io.BytesIO()
    torch.save({"rl_gap_rng": {"ranks": [capture_streams()]}}, buffer)
    expected = _draw()
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    buffer.seek(0)
    # Lightning's LightningCLI reads checkpoints with weights_only=True
    state = torch.load(buffer, weights_only=True)["rl_gap_rng"]["ranks"][0]
    restore_streams(state)
    assert _draw() == expected


def test_loader_iterators_leave_the_global_stream_and_seed_workers_by_epoch(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    callback = ResumeRandomState()
    loaders = [DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4) for _ in range(2)]
    for loader in loaders:
        loader.generator = callback._generator_for(loader, epoch=3)
    before = torch.get_rng_state()
    seeds = [iter(loader)._base_seed for loader in loaders]
    assert torch.equal(torch.get_rng_state(), before)  # the iterators drew nothing from it
    assert seeds[0] == seeds[1]  # a function of (seed, epoch): the same after a restart
    other = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4)
    other.generator = callback._generator_for(other, epoch=4)
    assert iter(other)._base_seed != seeds[0]
