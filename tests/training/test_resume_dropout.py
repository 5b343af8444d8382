"""A model with dropout resumes bit-identically: the checkpoint holds every random stream.

A tiny ViT with dropout (``drop_rate``, ``proj_drop_rate``, ``attn_drop_rate``) trains on
the MNIST demo; a real SIGTERM mid-way through the second epoch writes ``last.ckpt`` and
``--ckpt_path last`` finishes the run. Every tensor must equal the uninterrupted run's,
with and without micro-batching (gradient caching replays each micro-batch's dropout masks).
Without the saved streams the resumed masks differ and so do the weights (max |diff| ~1e-4).
"""

import pytest
from cluster_helpers import assert_same_weights, fit_argv, weights

from rl_gap.training.cli import run_lightning_cli

EPOCHS, BATCHES, STEP = 2, 2, 3  # SIGTERM after step 3: mid-way through the second epoch
VIT = [
    "--model.init_args.backbone", "vit_tiny_patch16_224",
    "--model.init_args.backbone_kwargs",
    "{img_size: 28, patch_size: 7, depth: 1, embed_dim: 24, num_heads: 2, drop_rate: 0.1,"
    " proj_drop_rate: 0.2, attn_drop_rate: 0.2}",
    "--data.init_args.batch_size", "40", "--data.init_args.m_per_class", "8",
]  # fmt: skip


def _fit(out, name, *extra):
    argv = fit_argv(out, name, *VIT, *extra, epochs=EPOCHS, batches=BATCHES)
    return run_lightning_cli(["fit", *argv])


@pytest.mark.parametrize("micro", [None, "15"], ids=["whole-batch", "micro-batch-15"])
def test_dropout_model_resumes_bit_identically_after_sigterm(run_dir, micro):
    extra = [] if micro is None else ["--model.init_args.micro_batch_size", micro]
    full = _fit(run_dir, "full", *extra)
    assert full.trainer.global_step == EPOCHS * BATCHES
    with pytest.raises(SystemExit) as exit_info:
        _fit(run_dir, "cut", *extra, "--trainer.callbacks+=fault_helpers.SigtermAtStep",
             f"--trainer.callbacks.step={STEP}")  # fmt: skip
    assert exit_info.value.code == 143
    resumed = _fit(run_dir, "cut", *extra, "--ckpt_path", "last")
    assert resumed.trainer.global_step == EPOCHS * BATCHES
    assert_same_weights(weights(resumed), weights(full))


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.parametrize("micro", [None, "10"], ids=["whole-batch", "micro-batch-10"])
def test_dropout_model_resumes_bit_identically_on_two_ranks(run_dir, micro):
    """2 gloo ranks (``ddp_spawn``): each rank's streams are saved and restored to that rank."""
    from cluster_helpers import load

    from tests.training.test_sigterm_ddp import _command, _run

    extra = [*VIT] + ([] if micro is None else ["--model.init_args.micro_batch_size", micro])
    run_dir.mkdir(parents=True, exist_ok=True)

    def fit(name, *more):
        argv = fit_argv(run_dir, name, *extra, *more, epochs=EPOCHS, batches=BATCHES)
        return _run(_command("ddp_spawn", argv), run_dir / f"{name}.err")

    status, err = fit("full")
    assert status == 0, err[-3000:]
    status, err = fit("cut", "--trainer.callbacks+=fault_helpers.SigtermAtStep",
                      f"--trainer.callbacks.step={STEP}")  # fmt: skip
    assert status == 143, err[-3000:]
    assert load(run_dir / "cut" / "checkpoints" / "last.ckpt")["global_step"] == STEP
    assert len(load(run_dir / "cut" / "checkpoints" / "last.ckpt")["rl_gap_rng"]["ranks"]) == 2
    status, err = fit("cut", "--ckpt_path", "last")
    assert status == 0, err[-3000:]
    final = load(run_dir / "cut" / "checkpoints" / "last.ckpt")
    assert final["global_step"] == EPOCHS * BATCHES
    expected = load(run_dir / "full" / "checkpoints" / "last.ckpt")
    assert_same_weights(weights(final), weights(expected))
