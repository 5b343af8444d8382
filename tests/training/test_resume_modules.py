"""Every module's mid-epoch resume is bit-identical to the uninterrupted run.

MoCo v3 (two random views per image) and CLIP (random crops of image-caption pairs) train on
the resumable loader (``rl_gap.data.resumable``): a real SIGTERM mid-way through the second
epoch writes ``last.ckpt``, ``--ckpt_path last`` finishes the run, and every tensor of the
model equals the uninterrupted run's. (Metric learning: ``test_fault_tolerance``.)
"""

import pytest
from cluster_helpers import ROOT, assert_same_weights, weights

from rl_gap.training.cli import run_lightning_cli

EPOCHS, BATCHES, STEP = 2, 2, 3  # SIGTERM after step 3: mid-way through the second epoch
COMMON = [
    "--wandb", "off", "--trainer.max_epochs", str(EPOCHS),
    "--trainer.limit_train_batches", str(BATCHES), "--trainer.check_val_every_n_epoch", "100",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip
MODULES = {
    "moco_v3": [
        "--config", str(ROOT / "recipes" / "demo" / "mnist_moco_gsap.yaml"),
        "--data.init_args.num_train", "128", "--data.init_args.batch_size", "16",
        "--data.init_args.num_workers", "1",
        "--model.init_args.backbone_kwargs",
        "{img_size: 28, patch_size: 7, in_chans: 1, depth: 1, embed_dim: 24, num_heads: 2}",
        "--model.init_args.hidden_dim", "32", "--model.init_args.embed_dim", "16",
    ],
    "clip": [
        "--config", str(ROOT / "recipes" / "demo" / "glyphs_gsap.yaml"),
        "--data.init_args.batch_size", "16", "--data.init_args.train_renders", "1",
    ],
}  # fmt: skip


def _fit(out, module, name, *extra):
    return run_lightning_cli(
        ["fit", *MODULES[module], *COMMON, "--output_dir", str(out), "--run_name", name, *extra]
    )


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(MODULES))
def test_mid_epoch_sigterm_resume_is_bit_identical(run_dir, module):
    full = _fit(run_dir, module, "full")
    assert full.trainer.global_step == EPOCHS * BATCHES
    with pytest.raises(SystemExit) as exit_info:
        _fit(run_dir, module, "cut", "--trainer.callbacks+=fault_helpers.SigtermAtStep",
             f"--trainer.callbacks.step={STEP}")  # fmt: skip
    assert exit_info.value.code == 143
    resumed = _fit(run_dir, module, "cut", "--ckpt_path", "last")
    assert resumed.trainer.global_step == EPOCHS * BATCHES
    assert_same_weights(weights(resumed), weights(full))
