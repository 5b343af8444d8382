"""SigLIP (rl_gap/losses/siglip.py) against open_clip 3.3.0's own ``SigLipLoss``.

``SigLipLoss.forward(image_features, text_features, logit_scale, logit_bias)`` takes the
exponentiated scale, uses labels ``2·eye − 1`` (our z) and divides the summed
``−logsigmoid`` by ``image_features.shape[0]`` = Q, i.e. docs/definitions.md's
``−(1/Q) Σ log σ(z (t s + b))``.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from open_clip.loss import SigLipLoss

from rl_gap.losses import build_loss


def features(n: int = 8, dim: int = 16, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    image = F.normalize(torch.randn(n, dim, generator=gen, dtype=torch.float64), dim=1)
    text = F.normalize(torch.randn(n, dim, generator=gen, dtype=torch.float64), dim=1)
    return image.requires_grad_(True), text.requires_grad_(True)


@pytest.mark.parametrize(("log_scale_init", "bias_init"), [(math.log(10.0), -10.0), (1.3, -2.0)])
def test_siglip_equals_open_clip_siglip_loss(log_scale_init, bias_init):
    image, text = features(seed=2)
    log_scale = torch.tensor(log_scale_init, dtype=torch.float64, requires_grad=True)
    bias = torch.tensor(bias_init, dtype=torch.float64, requires_grad=True)
    ref = SigLipLoss()(image, text, log_scale.exp(), bias)
    ref_grads = torch.autograd.grad(ref, (image, text, log_scale, bias))

    loss_fn = build_loss("siglip", init_log_scale=log_scale_init, init_bias=bias_init).double()
    with torch.no_grad():  # parameters were initialised in float32; use the exact inits
        loss_fn.log_scale.fill_(log_scale_init)
        loss_fn.bias.fill_(bias_init)
    image2, text2 = features(seed=2)
    loss = loss_fn(image2 @ text2.T, torch.eye(8, dtype=torch.bool))
    grads = torch.autograd.grad(loss, (image2, text2, loss_fn.log_scale, loss_fn.bias))

    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    logs = loss_fn.extra_logs()
    assert logs["logit_scale"] == pytest.approx(math.exp(log_scale_init))
    assert logs["logit_bias"] == pytest.approx(bias_init)


def test_siglip_defaults_follow_the_paper():
    loss_fn = build_loss("siglip")
    assert float(loss_fn.log_scale.detach()) == pytest.approx(math.log(10.0))
    assert float(loss_fn.bias.detach()) == pytest.approx(-10.0)
    assert {n for n, _ in loss_fn.named_parameters()} == {"log_scale", "bias"}


def test_siglip_valid_mask_removes_pairs():
    gen = torch.Generator().manual_seed(6)
    sim = torch.rand(5, 4, generator=gen, dtype=torch.float64)
    rel = torch.rand(5, 4, generator=gen) < 0.4
    valid = torch.rand(5, 4, generator=gen) > 0.3
    t, b = 10.0, -10.0
    want = 0.0
    for q in range(5):
        for d in range(4):
            if valid[q, d]:
                z = 1.0 if rel[q, d] else -1.0
                want -= math.log(1 / (1 + math.exp(-z * (t * float(sim[q, d]) + b))))
    loss_fn = build_loss("siglip").double()
    with torch.no_grad():
        loss_fn.log_scale.fill_(math.log(t))
    got = loss_fn(sim, rel, valid)
    assert float(got.detach()) == pytest.approx(want / 5, rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"init_log_scale": 1000.0},
            r"init_log_scale .* at most log\(max_scale\) = 4.605, got 1000",
        ),
        ({"init_log_scale": math.nan}, "init_log_scale .* must be finite"),
        ({"init_log_scale": math.log(200.0)}, "at most log"),
        ({"init_bias": math.inf}, "init_bias must be finite"),
        ({"max_scale": 0.0}, "max_scale must be a finite number > 0"),
        ({"max_scale": math.nan}, "max_scale must be a finite number > 0"),
    ],
)
def test_siglip_rejects_settings_that_give_an_infinite_loss(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_loss("siglip", **kwargs)


def test_siglip_scale_is_clamped_at_max_scale():
    """A learnt t' past log(max_scale) ranks with t = max_scale (open_clip's cap) and stops there."""
    gen = torch.Generator().manual_seed(3)
    sim = torch.rand(4, 4, generator=gen, dtype=torch.float64) * 2 - 1
    rel = torch.eye(4, dtype=torch.bool)
    want = 0.0
    for q in range(4):
        for d in range(4):
            z = 1.0 if q == d else -1.0
            want += math.log1p(math.exp(-z * (100.0 * float(sim[q, d]) - 10.0)))
    loss_fn = build_loss("siglip").double()
    with torch.no_grad():
        loss_fn.log_scale.fill_(1000.0)  # as if training had pushed it far past the cap
    loss = loss_fn(sim, rel)
    assert float(loss.detach()) == pytest.approx(want / 4, rel=1e-12)
    grad_scale, grad_bias = torch.autograd.grad(loss, (loss_fn.log_scale, loss_fn.bias))
    assert float(grad_scale) == 0.0 and float(grad_bias) != 0.0
    assert loss_fn.extra_logs()["logit_scale"] == pytest.approx(100.0)
    wide = build_loss("siglip", init_log_scale=math.log(500.0), max_scale=1000.0)
    assert wide.extra_logs()["logit_scale"] == pytest.approx(500.0, rel=1e-6)
