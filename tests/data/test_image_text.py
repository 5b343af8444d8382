"""The CLIP data module: real loaders through a fit, batch-size errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from rl_gap.data.image_text import ImageTextDataModule
from tests.data.test_image_text_sets import write_images, write_karpathy


def test_datamodule_fast_dev_run_with_csv_karpathy_and_zero_shot(tmp_path):
    """fit(fast_dev_run) through the real loaders: training pairs, retrieval, zero-shot."""
    import lightning as L

    from rl_gap.models.clip import tiny_clip_config
    from rl_gap.modules.clip_finetune import CLIPFineTuneModule

    rows = ["filepath,title"]
    for i in range(8):
        Image.fromarray(np.full((40, 40, 3), 30 * i, dtype=np.uint8)).save(tmp_path / f"{i}.png")
        rows.append(f"{i}.png,gray level {i}")
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    karpathy = write_karpathy(tmp_path)
    write_images(tmp_path / "zs" / "red", [("1.png", 200)])
    write_images(tmp_path / "zs" / "black", [("1.png", 0)])
    dm = ImageTextDataModule(
        train_table=str(tmp_path / "train.csv"),
        retrieval=[{"name": "coco", "annotations": str(karpathy), "image_root": str(tmp_path)}],
        zero_shot=[{"name": "colors", "root": str(tmp_path / "zs"), "templates": ["a {} image"]}],
        batch_size=4,
        num_workers=0,
    )
    torch.manual_seed(0)
    module = CLIPFineTuneModule(
        model_name=None, model_config=tiny_clip_config(width=32, context_length=16)
    )
    trainer = L.Trainer(
        accelerator="cpu",
        fast_dev_run=True,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=dm)
    assert dm.image_size == 32 and dm.tokenizer is module.clip.tokenizer
    logged = trainer.callback_metrics
    for key in ("coco/i2t_gap", "coco/t2i_map", "coco/i2t_r@1", "colors/zs_top1"):
        assert f"val/{key}" in logged, sorted(logged)
    assert torch.isfinite(logged["train/loss"])
    too_big = ImageTextDataModule(train_table=str(tmp_path / "train.csv"), batch_size=64)
    too_big.configure_for_model(module.clip.tokenizer, 32, module.clip.mean, module.clip.std)
    with pytest.raises(ValueError, match="fewer than batch_size"):
        too_big.train_dataloader()
