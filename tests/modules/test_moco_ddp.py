"""Two-process DDP MoCo v3 step == one process holding the whole batch.

Keys are gathered across ranks, so the global similarity matrix and the
update are those of a single process with the global batch; without the
gather each rank would rank only its own 4 keys and the losses would differ.
The online kNN/retrieval evaluation syncs its features across ranks too.
BatchNorm is off in the MLPs here because CPU has no SyncBatchNorm (per-rank
BN statistics would differ from the single-process ones by design).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from rl_gap.modules.moco_v3 import MoCoV3Module

KWARGS = dict(
    backbone="vit_tiny_patch16_224",
    backbone_kwargs=dict(img_size=8, patch_size=4, in_chans=1, depth=1, embed_dim=16, num_heads=2),
    hidden_dim=32,
    embed_dim=8,
    mlp_batchnorm=False,
    momentum=0.9,
    loss={"name": "infonce", "temperature": 0.2, "symmetric": False},
    optimizer="sgd",
    lr=0.5,
    weight_decay=0.0,
    scheduler="none",
    retrieval_max_queries=100,
)


class Views(Dataset):
    def __init__(self, n: int = 8) -> None:
        g = torch.Generator().manual_seed(0)
        self.x1 = torch.randn(n, 1, 8, 8, generator=g)
        self.x2 = self.x1 + 0.5 * torch.randn(n, 1, 8, 8, generator=g)

    def __len__(self) -> int:
        return len(self.x1)

    def __getitem__(self, i):
        return {"views": [self.x1[i], self.x2[i]], "label": 0}


class Images(Dataset):
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 1, 8, 8, generator=g)
        self.y = torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return {"image": self.x[i], "label": int(self.y[i])}


def _fit(devices: int, per_device_batch: int) -> tuple[MoCoV3Module, dict]:
    torch.manual_seed(0)
    module = MoCoV3Module(**KWARGS)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp_spawn" if devices > 1 else "auto",
        max_epochs=1,
        limit_train_batches=1,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    val = [DataLoader(Images(12, 1), batch_size=4), DataLoader(Images(8, 2), batch_size=4)]
    trainer.fit(module, DataLoader(Views(8), batch_size=per_device_batch), val)
    return module, {k: float(v) for k, v in trainer.callback_metrics.items()}


@pytest.mark.ddp
def test_ddp_step_gathers_keys_and_matches_single_process():
    single, single_metrics = _fit(devices=1, per_device_batch=8)
    multi, multi_metrics = _fit(devices=2, per_device_batch=4)
    assert multi_metrics["train/loss"] == pytest.approx(single_metrics["train/loss"], rel=1e-5)
    for key in ("val/knn_top1", "val/gap", "val/map"):
        assert multi_metrics[key] == pytest.approx(single_metrics[key], abs=1e-6), key
    # Same update of the online encoder and predictor, and of the momentum encoder.
    for (name, a), b in zip(single.named_parameters(), multi.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)
    # The step did move the weights (so the comparison above is not vacuous).
    torch.manual_seed(0)
    init = MoCoV3Module(**KWARGS)
    moved = [
        not torch.allclose(a, b)
        for a, b in zip(init.predictor.parameters(), single.predictor.parameters())
    ]
    assert any(moved)
