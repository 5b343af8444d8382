"""perf/* keys: global samples per second, data-loading and step time per step."""

import csv
import time

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset

from rl_gap.callbacks.speed import TrainingSpeed, batch_size

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
    rows = [r for r in csv.DictReader((tmp_path / "version_0" / "metrics.csv").open())
            if r.get("perf/samples_per_sec")]  # fmt: skip
    assert rows, "no perf/* row logged"
    for row in rows:
        speed, step, data = (
            float(row[f"perf/{k}"]) for k in ("samples_per_sec", "step_time", "data_time")
        )
        assert abs(speed * step - 4) < 1e-6  # 4 samples per step, one process
        assert data >= 4 * PAUSE  # the loader slept this long for each batch
        assert step >= data
    assert "perf/gpu_mem_gb" not in rows[0]  # CPU: no CUDA memory key
