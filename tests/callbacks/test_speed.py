"""Throughput: Lightning's ThroughputMonitor fed with counted FLOPs, and perf/* for the
loader wait per step that the monitor cannot see."""

import csv
import time

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset

from rl_gap.callbacks.speed import TrainingSpeed, batch_size, throughput_callbacks

PAUSE = 0.01  # seconds per item the loader sleeps


class SlowData(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        time.sleep(PAUSE)
        return {"x": torch.full((3,), float(i)), "y": torch.tensor(i % 2)}


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch["x"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _rows(tmp_path):
    return list(csv.DictReader((tmp_path / "version_0" / "metrics.csv").open()))


def test_batch_size_of_nested_batches():
    assert batch_size(torch.zeros(5, 2)) == 5
    assert batch_size({"meta": "a", "x": torch.zeros(4, 1)}) == 4
    assert batch_size(([torch.zeros(3)], torch.zeros(7))) == 3
    assert batch_size({"meta": "a"}) is None


def test_speed_keys_in_the_log(tmp_path):
    trainer = L.Trainer(
        max_epochs=1, log_every_n_steps=2, logger=CSVLogger(tmp_path, name=""),
        callbacks=[TrainingSpeed(every_n_steps=2)], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    trainer.fit(Tiny(), DataLoader(SlowData(), batch_size=4))
    rows = [r for r in _rows(tmp_path) if r.get("perf/data_time")]
    assert rows, "no perf/* row logged"
    for row in rows:
        step, data = (float(row[f"perf/{k}"]) for k in ("step_time", "data_time"))
        assert data >= 4 * PAUSE  # the loader slept this long for each batch
        assert step >= data
    assert "perf/gpu_mem_gb" not in rows[0]  # CPU: no CUDA memory key


def test_throughput_monitor_with_counted_flops(tmp_path):
    module = Tiny()
    trainer = L.Trainer(
        max_epochs=1, log_every_n_steps=1, logger=CSVLogger(tmp_path, name=""),
        callbacks=throughput_callbacks(window_size=3), enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    trainer.fit(module, DataLoader(SlowData(), batch_size=4))
    # Linear(3 -> 1) on 4 rows: forward 2·4·3·1 FLOPs, the weight gradient as many again
    # (the input needs no gradient); the optimizer's element-wise update is not counted
    assert module.flops_per_batch == 2 * (2 * 4 * 3 * 1)
    rows = [r for r in _rows(tmp_path) if r.get("train/device/samples_per_sec")]
    assert len(rows) == 6 - 3 + 1  # 6 steps, a window of 3 batches
    for row in rows:
        samples = float(row["train/device/samples_per_sec"])
        batches = float(row["train/device/batches_per_sec"])
        flops = float(row["train/device/flops_per_sec"])
        assert samples == pytest.approx(4 * batches)  # 4 samples per batch
        assert flops == pytest.approx(48 * batches)
        assert batches < 1 / (4 * PAUSE)  # each batch waited 4 x PAUSE for its items
    assert "train/device/mfu" not in rows[0]  # no peak FLOPs known for a CPU
