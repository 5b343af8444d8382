"""InfoNCE (rl_gap/losses/infonce.py) against open_clip 3.3.0's own ``ClipLoss`` and plain loops.

``ClipLoss.forward(image_features, text_features, logit_scale)`` (open_clip/loss.py, 3.3.0)
takes the *exponentiated* scale and averages the image->text and text->image cross
entropies with labels ``arange(N)``: our ``infonce`` with ``rel = eye``,
``symmetric=True`` and scale ``exp(log_logit_scale)``.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from open_clip.loss import ClipLoss

from rl_gap.losses import build_loss


def features(n: int = 8, dim: int = 16, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    image = F.normalize(torch.randn(n, dim, generator=gen, dtype=torch.float64), dim=1)
    text = F.normalize(torch.randn(n, dim, generator=gen, dtype=torch.float64), dim=1)
    return image.requires_grad_(True), text.requires_grad_(True)


def test_infonce_learnable_scale_equals_open_clip_clip_loss():
    image, text = features()
    log_scale = torch.tensor(math.log(1 / 0.07), dtype=torch.float64, requires_grad=True)
    ref = ClipLoss()(image, text, log_scale.exp())
    ref_grads = torch.autograd.grad(ref, (image, text, log_scale))

    loss_fn = build_loss("infonce", symmetric=True, learnable_scale=True).double()
    with torch.no_grad():  # the parameter was initialised in float32; use the exact init
        loss_fn.log_logit_scale.fill_(math.log(1 / 0.07))
    image2, text2 = features()
    sim = image2 @ text2.T
    loss = loss_fn(sim, torch.eye(8, dtype=torch.bool))
    grads = torch.autograd.grad(loss, (image2, text2, loss_fn.log_logit_scale))

    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert loss_fn.extra_logs()["logit_scale"] == pytest.approx(1 / 0.07)


def test_infonce_fixed_temperature_equals_open_clip():
    image, text = features(seed=1)
    ref = ClipLoss()(image, text, 1 / 0.05)
    ref_grads = torch.autograd.grad(ref, (image, text))
    image2, text2 = features(seed=1)
    loss = build_loss("infonce", temperature=0.05, symmetric=True)(
        image2 @ text2.T, torch.eye(8, dtype=torch.bool)
    )
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(torch.autograd.grad(loss, (image2, text2)), ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_infonce_scale_is_clamped_at_max():
    loss_fn = build_loss("infonce", learnable_scale=True)
    with torch.no_grad():
        loss_fn.log_logit_scale.fill_(math.log(500.0))
    assert loss_fn.extra_logs()["logit_scale"] == pytest.approx(100.0)


def test_infonce_multi_positive_matches_plain_loops():
    gen = torch.Generator().manual_seed(4)
    sim = torch.rand(6, 7, generator=gen, dtype=torch.float64) * 2 - 1
    rel = torch.rand(6, 7, generator=gen) < 0.35
    rel[4] = False
    valid = torch.rand(6, 7, generator=gen) > 0.2
    valid[0, 0] = rel[0, 0] = True
    tau = 0.1

    def one_direction(s, r, v):
        losses = []
        for q in range(s.shape[0]):
            cols = [d for d in range(s.shape[1]) if v[q, d]]
            pos = [d for d in cols if r[q, d]]
            if not pos:
                continue
            log_z = math.log(sum(math.exp(float(s[q, d]) / tau) for d in cols))
            losses.append(sum(log_z - float(s[q, p]) / tau for p in pos) / len(pos))
        return sum(losses) / len(losses)

    for symmetric in (False, True):
        want = one_direction(sim, rel, valid)
        if symmetric:
            want = 0.5 * (want + one_direction(sim.T, rel.T, valid.T))
        got = build_loss("infonce", temperature=tau, symmetric=symmetric)(sim, rel, valid)
        assert float(got) == pytest.approx(want, rel=1e-12)


def test_infonce_learnable_scale_must_start_below_its_clamp():
    """1/τ above max_scale would sit on the clamp with zero gradient: refused, naming both."""
    with pytest.raises(ValueError, match=r"1/temperature = 1000, above max_scale = 100"):
        build_loss("infonce", temperature=1e-3, learnable_scale=True)
    with pytest.raises(ValueError, match="max_scale must be a finite number > 0"):
        build_loss("infonce", max_scale=math.inf)
    at_cap = build_loss("infonce", temperature=0.01, learnable_scale=True)  # 1/τ = 100 = cap
    assert float(at_cap.logit_scale().detach()) == pytest.approx(100.0, rel=1e-6)
    fixed = build_loss("infonce", temperature=1e-3)  # a fixed τ is not clamped
    assert fixed.logit_scale() == pytest.approx(1000.0)
