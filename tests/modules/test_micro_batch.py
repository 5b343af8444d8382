"""``micro_batch_size``: each module's micro-batched step equals the full-batch step.

The reference (``micro_batch_cases.reference_loss``) is written by hand from the
module's encoders and loss, one autograd graph, one backward: never the cached path.
float64: every parameter gradient within 1e-10 (relative norm), float32 within 1e-5.
With dropout the reference draws the masks micro-batch by micro-batch (same RNG
stream), so a replay that did not restore each micro-batch's RNG state fails.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from rl_gap.modules.grad_cache import micro_batches
from tests.modules.micro_batch_cases import (
    N,
    grads,
    make_batch,
    make_module,
    max_rel_diff,
    reference_loss,
)

MODULES = ("metric", "clip", "moco")
LOSS_NAMES = ("gsap", "infonce", "siglip")
MICRO = 3  # 8 rows -> micro-batches of 3, 3, 2


def micro_step(kind, loss, dtype=torch.float64, dropout=False, size=MICRO, **settings):
    """(loss, grads) of one micro-batched training step, and the module."""
    module = make_module(kind, loss, dtype, dropout, micro_batch_size=size, **settings)
    torch.manual_seed(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = module.training_step(make_batch(kind, dtype=dtype), 0)
    value.backward()
    return value.detach(), grads(module), module


def reference_step(kind, loss, dtype=torch.float64, dropout=False, size=None):
    module = make_module(kind, loss, dtype, dropout)
    torch.manual_seed(5)
    value = reference_loss(module, kind, make_batch(kind, dtype=dtype), size)
    value.backward()
    return value.detach(), grads(module)


# One case per module unmarked (the fast gSAP kernel with negative dropping, learnable
# SigLIP scale and bias, learnable InfoNCE scale); the rest of the grid is slow-marked.
DEFAULT = [("metric", "gsap"), ("clip", "siglip"), ("moco", "infonce")]
GRID = [
    pytest.param(k, n, marks=() if (k, n) in DEFAULT else pytest.mark.slow)
    for k in MODULES
    for n in LOSS_NAMES
]


@pytest.mark.parametrize(("kind", "loss"), GRID)
def test_micro_batched_step_equals_full_batch_step_float64_with_dropout(kind, loss):
    got_loss, got, module = micro_step(kind, loss, dropout=True)
    want_loss, want = reference_step(kind, loss, dropout=True, size=MICRO)
    assert len(want) > 5
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-12, atol=0)
    assert max_rel_diff(got, want) <= 1e-10
    if loss in ("infonce", "siglip"):  # learnable loss parameters: from the one loss evaluation
        names = [n for n in want if n.startswith("loss_fn.")]
        assert names and all(want[n].abs().max() > 0 for n in names)


def test_dropout_is_active_in_the_exactness_tests():
    _, with_dropout = reference_step("metric", "gsap", dropout=True, size=MICRO)
    _, without = reference_step("metric", "gsap", dropout=False, size=MICRO)
    assert max_rel_diff(with_dropout, without) > 1e-2


@pytest.mark.parametrize("kind", ["metric", pytest.param("clip", marks=pytest.mark.slow), "moco"])
def test_micro_batched_step_equals_one_pass_step_without_dropout(kind):
    _, want = reference_step(kind, "gsap", size=None)  # one encoder call over all 8 rows
    for size in (1, 5):
        _, got, _ = micro_step(kind, "gsap", size=size)
        assert max_rel_diff(got, want) <= 1e-10, size


@pytest.mark.parametrize(
    "kind",
    [
        "metric",
        pytest.param("clip", marks=pytest.mark.slow),
        pytest.param("moco", marks=pytest.mark.slow),
    ],
)
def test_micro_batched_step_float32(kind):
    """float32: against the reference with the encoders run on the same micro-batches
    (a one-pass float32 forward rounds its GEMMs differently: up to 2e-5 on the loss
    scale's gradient, a sum of cancelling terms, without any caching involved)."""
    got_loss, got, _ = micro_step(kind, "infonce", dtype=torch.float32)
    want_loss, want = reference_step(kind, "infonce", dtype=torch.float32, size=MICRO)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=0)
    assert max_rel_diff(got, want) <= 1e-5


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("metric", marks=pytest.mark.slow),
        "clip",
        pytest.param("moco", marks=pytest.mark.slow),
    ],
)
def test_micro_batched_step_under_bf16_autocast(kind):
    """bf16-mixed: the replay runs under the first pass's autocast. The reference runs the
    encoders on the same micro-batches under bf16 autocast (a one-pass bf16 forward rounds
    differently, ~5e-3, with or without caching); similarities and loss in float32."""
    module = make_module(kind, "siglip", torch.float32, micro_batch_size=MICRO)
    batch = make_batch(kind, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got_loss = module.training_step(batch, 0)
    got_loss.backward()
    reference = make_module(kind, "siglip", torch.float32)
    want_loss = reference_loss(reference, kind, batch, MICRO, bf16=True)
    want_loss.backward()
    torch.testing.assert_close(got_loss.detach(), want_loss.detach(), rtol=1e-5, atol=0)
    assert max_rel_diff(grads(module), grads(reference)) <= 1e-5


def test_momentum_keys_are_computed_once_per_micro_batch():
    module = make_module("moco", "infonce", micro_batch_size=MICRO)
    calls = []
    module.momentum_encoder.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    value = module.training_step(make_batch("moco"), 0)
    value.backward()
    assert calls == [3, 3, 3, 3, 2, 2]  # two views per micro-batch, none in the replay


def test_batchnorm_warns_and_buffers_are_updated_once():
    module = make_module("metric", "gsap", micro_batch_size=MICRO)
    module.encoder.head = torch.nn.Sequential(
        torch.nn.BatchNorm1d(16).double(), module.encoder.head
    )
    with pytest.warns(UserWarning, match="BatchNorm1d.*per micro-batch"):
        module.setup("fit")
    bn = module.encoder.head[0]
    value = module.training_step(make_batch("metric"), 0)
    after_first_pass = bn.num_batches_tracked.item()
    value.backward()
    assert after_first_pass == 3 and bn.num_batches_tracked.item() == 3  # not 6


def test_micro_batch_size_is_checked():
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="micro_batch_size must be a positive integer"):
            make_module("metric", "gsap", micro_batch_size=bad)
    assert micro_batches(8, 3) == [slice(0, 3), slice(3, 6), slice(6, 8)]
    assert micro_batches(2, 5) == [slice(0, 2)]


def test_evaluation_without_autograd_is_one_pass():
    module = make_module("metric", "gsap", micro_batch_size=MICRO)
    with torch.no_grad():
        sim, _, _ = module.global_similarity(make_batch("metric"))
    assert sim.shape == (N, N) and sim.grad_fn is None
