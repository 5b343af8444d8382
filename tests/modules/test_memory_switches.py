"""``grad_checkpointing`` (timm backbones) and ``compile`` (torch.compile of the encoders).

Checkpointing must re-run each block in backward (counted with a forward hook) and
leave every gradient as without it (float64, 1e-10), also under micro-batches; a
backbone without ``set_grad_checkpointing`` is a clear error. Compiling must leave
values and gradients those of eager mode (float32 tolerance) and the checkpoint keys
unchanged.
"""

from __future__ import annotations

import pytest
import torch

from rl_gap.modules.metric_learning import MetricLearningModule
from tests.modules.micro_batch_cases import grads, make_batch, make_module, max_rel_diff


def _step(kind, dtype=torch.float64, **settings):
    module = make_module(kind, "gsap", dtype, **settings)
    block = (module.encoder.backbone if kind == "metric" else module.online.backbone).blocks[0]
    calls = []
    block.register_forward_pre_hook(lambda m, i: calls.append(1))  # recompute stops early
    value = module.training_step(make_batch(kind, dtype=dtype), 0)
    value.backward()
    return grads(module), len(calls), module


@pytest.mark.parametrize("kind", ["metric", "moco"])
def test_grad_checkpointing_recomputes_blocks_with_the_same_gradients(kind):
    want, plain_calls, _ = _step(kind)
    got, calls, _ = _step(kind, grad_checkpointing=True)
    per_pass = 1 if kind == "metric" else 2  # MoCo: both views through the online backbone
    assert plain_calls == per_pass and calls == 2 * per_pass  # forward + recompute in backward
    assert max_rel_diff(got, want) <= 1e-10
    got, _, _ = _step(kind, grad_checkpointing=True, micro_batch_size=3)
    assert max_rel_diff(got, want) <= 1e-10


def test_grad_checkpointing_needs_a_backbone_that_supports_it():
    with pytest.raises(
        ValueError, match="'rl_gap_convnet' does not support gradient checkpointing"
    ):
        MetricLearningModule(backbone="rl_gap_convnet", dim=4, in_chans=1, grad_checkpointing=True)


@pytest.mark.slow  # torch.compile (inductor) builds C++ kernels: minutes on a busy CPU
def test_compiled_encoder_matches_eager():
    want, _, eager = _step("metric", torch.float32)
    got, _, compiled = _step("metric", torch.float32, compile=True, micro_batch_size=3)
    assert compiled.encoder._compiled_call_impl is not None
    assert list(compiled.state_dict()) == list(eager.state_dict())  # checkpoints keep their keys
    assert max_rel_diff(got, want) <= 1e-5
