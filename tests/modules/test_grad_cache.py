"""``cached_encode`` with every registered loss, no training module involved.

A small float64 encoder with dropout and LayerNorm embeds 10 labelled rows in
micro-batches of 3 through the gradient cache; every registered loss ranks the
(10, 10) cosine matrix. The reference runs the encoder with autograd on the same
micro-batches (same RNG stream, same dropout masks), concatenates, applies the
loss and back-propagates once. Loss values and every gradient (encoder and loss
parameters) must agree to 1e-10.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from rl_gap.losses import available_losses, build_loss
from rl_gap.modules.grad_cache import cached_encode

N, SIZE = 10, 3
LABELS = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 3, 3])


def encoder() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(5, 12), nn.GELU(), nn.Dropout(0.3), nn.LayerNorm(12), nn.Linear(12, 4)
    ).double()


def ranked(emb: torch.Tensor, loss_fn: nn.Module) -> torch.Tensor:
    emb = F.normalize(emb, dim=1)
    valid = ~torch.eye(N, dtype=torch.bool)
    return loss_fn(emb @ emb.T, LABELS[:, None] == LABELS[None, :], valid)


def step(loss_name: str, cached: bool):
    net = encoder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss_fn = build_loss(loss_name).double()
    x = torch.randn(N, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.manual_seed(7)
    if cached:
        (emb,), _ = cached_encode(
            lambda rows: (net(x[rows]),), N, SIZE, list(net.parameters()), net
        )
    else:
        emb = torch.cat([net(x[s : s + SIZE]) for s in range(0, N, SIZE)])
    value = ranked(emb, loss_fn)
    value.backward()
    params = [*net.named_parameters(), *(("loss." + n, p) for n, p in loss_fn.named_parameters())]
    return value.detach(), {n: p.grad.clone() for n, p in params if p.grad is not None}


@pytest.mark.parametrize("loss_name", available_losses())
def test_cached_encoding_equals_full_batch_gradient_for_every_loss(loss_name):
    got_value, got = step(loss_name, cached=True)
    want_value, want = step(loss_name, cached=False)
    torch.testing.assert_close(got_value, want_value, rtol=1e-12, atol=1e-14)
    assert set(got) == set(want) and len(want) >= 6
    assert any(float(g.abs().max()) > 0 for g in want.values())
    for name, w in want.items():
        scale = float(w.norm())
        assert float((got[name] - w).norm()) <= 1e-10 * max(scale, 1e-12), name


def test_the_global_rng_continues_as_after_the_first_pass():
    """The replay restores each micro-batch's RNG state, then leaves the generator as it found it."""
    net = encoder()
    x = torch.randn(N, 5, dtype=torch.float64)
    torch.manual_seed(3)
    (emb,), _ = cached_encode(lambda rows: (net(x[rows]),), N, SIZE, list(net.parameters()), net)
    after_forward = torch.get_rng_state()
    emb.sum().backward()
    assert torch.equal(torch.get_rng_state(), after_forward)
