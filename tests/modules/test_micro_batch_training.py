"""``micro_batch_size`` inside Lightning: the trainer's steps equal full-batch steps, and
``--ckpt_path last`` resumes a micro-batched run exactly (one optimizer step per batch).
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from rl_gap.training.cli import run_lightning_cli
from tests.modules.micro_batch_cases import make_module
from tests.training.test_resume import CountSteps, InterruptAt, _argv, _weights


def fitted_weights(micro_batch_size, steps=3):
    module = make_module("metric", "gsap", micro_batch_size=micro_batch_size)
    # a stateful optimizer: moments must agree
    module.optimizer_settings = replace(module.optimizer_settings, optimizer="adamw", lr=1e-2)
    gen = torch.Generator().manual_seed(2)
    data = TensorDataset(
        torch.randn(8 * steps, 1, 8, 8, generator=gen, dtype=torch.float64),
        torch.randint(0, 3, (8 * steps,), generator=gen),
        torch.arange(8 * steps),
    )
    trainer = L.Trainer(
        max_steps=steps, precision="64-true", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        callbacks=[],
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, DataLoader(data, batch_size=8))
    assert trainer.global_step == steps
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_trainer_steps_with_micro_batches_equal_full_batch_steps():
    want, got = fitted_weights(None), fitted_weights(3)
    start = make_module("metric", "gsap").state_dict()
    moved = [k for k in want if not torch.equal(want[k], start[k])]
    assert len(moved) > 5
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.slow
def test_resume_of_a_micro_batched_run_matches_uninterrupted(run_dir):
    micro = ["--model.init_args.micro_batch_size", "16"]  # demo batches of 100: 7 micro-batches
    full = run_lightning_cli(["fit", *_argv(run_dir, "full", 2, 2), *micro])
    expected = _weights(full)
    crashed = run_lightning_cli([*_argv(run_dir, "resumed", 2, 2), *micro], run=False)
    crashed.trainer.callbacks.append(InterruptAt(epoch=1, batch=1))
    with pytest.raises(RuntimeError, match="simulated interruption"):
        crashed.trainer.fit(crashed.model, crashed.datamodule)
    resumed = run_lightning_cli([*_argv(run_dir, "resumed", 2, 2), *micro], run=False)
    assert resumed.model.micro_batch_size == 16
    counter = CountSteps()
    resumed.trainer.callbacks.append(counter)
    resumed.trainer.fit(resumed.model, resumed.datamodule, ckpt_path="last")
    assert counter.steps == 2 and resumed.trainer.global_step == 4
    for name, value in _weights(resumed).items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-6, msg=name)
