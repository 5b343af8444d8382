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


def _loss_and_grads(kind, **settings):
    module = make_module(kind, "gsap", torch.float32, **settings)
    loss = module.training_step(make_batch(kind, dtype=torch.float32), 0)
    loss.backward()
    return loss.detach(), grads(module), module


def _compiled(module):
    return [name for name, m in module.named_modules() if m._compiled_call_impl is not None]


COMPILED = {  # the submodules each module compiles
    "metric": ["encoder"],
    "clip": ["clip.model.visual", "clip.model.transformer"],
    "moco": ["online", "predictor", "momentum_encoder"],
}


def test_compile_options_go_to_torch_compile_and_keep_eager_values():
    """``compile: {backend: ...}``: traced by dynamo, run by AOTAutograd, no C++ build."""
    torch._dynamo.reset()
    traced = []

    def aot_eager_recording(graph, example_inputs):
        traced.append(graph)
        return torch._dynamo.lookup_backend("aot_eager")(graph, example_inputs)

    want_loss, want, eager = _loss_and_grads("metric")
    loss, got, compiled = _loss_and_grads("metric", compile={"backend": aot_eager_recording})
    assert _compiled(compiled) == COMPILED["metric"]
    assert traced, "the backend given in compile was not used"
    assert list(compiled.state_dict()) == list(eager.state_dict())  # checkpoints keep their keys
    assert abs(float(loss - want_loss)) <= 1e-6 * abs(float(want_loss))
    assert max_rel_diff(got, want) <= 1e-6


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"backnd": "eager"}, r"unknown torch.compile option\(s\) \['backnd'\]"),
        ({"backend": "no_such_backend"}, "unknown backend 'no_such_backend'"),
        ({"dynamic": "maybe"}, "compile: dynamic must be true, false or null, got 'maybe'"),
        ({"mode": "fastest"}, "compile: unknown mode 'fastest'"),
        ({"fullgraph": "yes"}, "compile: fullgraph must be true or false, got 'yes'"),
        ("eager", "compile: expected true, false or a mapping"),
    ],
)
def test_bad_compile_options_are_one_line_errors(settings, message):
    with pytest.raises(ValueError, match=message):
        make_module("metric", "gsap", compile=settings)


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory):
    """A fresh inductor cache: every kernel is generated and built by this test run."""
    return tmp_path_factory.mktemp("inductor")


@pytest.mark.slow  # inductor builds C++ kernels: 1-2 min per module on a busy 2-core CPU
@pytest.mark.parametrize("kind", ["metric", "clip", "moco"])
def test_inductor_compiled_encoders_match_eager(kind, inductor_cache, monkeypatch):
    from torch._inductor import config as inductor

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor_cache / kind))
    torch._dynamo.reset()
    want_loss, want, eager = _loss_and_grads(kind)
    with inductor.patch(compile_threads=1):  # no worker pool to start on a small CPU
        loss, got, compiled = _loss_and_grads(kind, compile={"dynamic": False})
    assert _compiled(compiled) == COMPILED[kind]
    assert list((inductor_cache / kind).rglob("*.so")), "inductor built no kernel"
    assert list(compiled.state_dict()) == list(eager.state_dict())
    assert abs(float(loss - want_loss)) <= 1e-5 * abs(float(want_loss))
    assert max_rel_diff(got, want) <= 1e-5
