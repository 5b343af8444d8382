"""The sigmoid Taylor tables of the fast gSAP kernel (rl_gap/losses/fast_sap/taylor.py):
derivatives against autograd, the remainder bound against direct Taylor errors."""

from __future__ import annotations

import math

import torch

from rl_gap.losses.fast_sap.taylor import relative_remainder, sigmoid_derivatives


def test_sigmoid_derivatives_match_autograd():
    # |u| <= 12: beyond, autograd's σ(1 − σ) loses digits to cancellation.
    u = torch.linspace(-12, 12, 121, dtype=torch.float64).requires_grad_()
    table = sigmoid_derivatives(u.detach(), 3)
    value = torch.sigmoid(u)
    for n in range(4):
        assert torch.allclose(table[:, n], value.detach(), rtol=1e-8, atol=1e-300)
        if n < 3:
            (value,) = torch.autograd.grad(value.sum(), u, create_graph=True)


def test_remainder_bound_covers_direct_taylor_errors():
    # The Taylor remainder of σ about u with offset t, relative to σ(u + t),
    # checked on random points against the tabulated bound.
    gen = torch.Generator().manual_seed(8)
    u = (torch.rand(2000, generator=gen, dtype=torch.float64) - 0.5) * 60
    t = (torch.rand(2000, generator=gen, dtype=torch.float64) - 0.5) * 0.5  # |t| <= 0.25
    for order in (2, 4, 8):
        deriv = sigmoid_derivatives(u, order)
        approx = sum(deriv[:, n] * t**n / math.factorial(n) for n in range(order + 1))
        exact = torch.sigmoid(u + t)
        worst = float(((exact - approx).abs() / exact).max())
        assert worst <= relative_remainder(0.25, order)
        assert relative_remainder(0.25, order) < 0.25 ** (order + 1)
