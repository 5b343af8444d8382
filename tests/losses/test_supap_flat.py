"""SupAP of one long list (rl_gap/losses/supap_flat.py) against the paper's rank form
(``tests/surrogate_refs.py``: every comparison through H⁻, full broadcast, autograd)."""

from __future__ import annotations

import math

import pytest
import torch
from surrogate_refs import brute_supap

from rl_gap.losses import build_loss
from rl_gap.losses.supap import supap
from rl_gap.losses.supap_flat import SupAPParams, supap_one_list

SETTINGS = [(0.01, 100.0, 1.44, 0.05, 0.5), (0.05, 10.0, 1.0, 0.2, 0.0)]


@pytest.mark.parametrize("params", SETTINGS)
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_value_and_gradient_are_the_rank_form(params, chunk_size):
    gen = torch.Generator().manual_seed(7)
    scores = (torch.rand(60, generator=gen, dtype=torch.float64) * 1.8 - 0.9).round(decimals=6)
    positive = torch.rand(60, generator=gen) < 0.3
    positive[0] = True
    ignored = (torch.rand(60, generator=gen) < 0.1) & ~positive  # neither positive nor negative
    negative = ~positive & ~ignored
    value, grad = supap_one_list(scores, positive, negative, params, chunk_size, True)
    kept = positive | negative
    leaf = scores.clone().requires_grad_(True)
    ref = brute_supap(leaf[kept], positive[kept].tolist(), *params)
    ref.backward()
    torch.testing.assert_close(value, ref.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, leaf.grad, rtol=0, atol=1e-10)
    assert float(grad[ignored].abs().max()) == 0.0
    _, no_grad = supap_one_list(scores, positive, negative, params, chunk_size, False)
    assert no_grad is None


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"temperature": 0.0}, "temperature must be a finite number > 0"),
        ({"rho": -1.0}, "rho must be a finite number >= 0"),
        ({"offset": math.inf}, "offset must be finite"),
        ({"margin": math.nan}, "margin must be a finite number >= 0"),
        ({"start": -0.5}, "start must be a finite number >= 0"),
    ],
)
def test_params_are_checked_once_for_the_loss_and_the_kernel(bad, message):
    settings = {"temperature": 0.01, "rho": 100.0, "offset": 1.44, "margin": 0.05, "start": 0.5}
    with pytest.raises(ValueError, match=message):
        SupAPParams.checked(**{**settings, **bad})
    with pytest.raises(ValueError, match=message):
        build_loss("supap", **bad)
    scores, positive = torch.tensor([[0.3, 0.1]]), torch.tensor([[True, False]])
    with pytest.raises(ValueError, match=message):
        supap(scores, positive, torch.ones_like(positive), tuple({**settings, **bad}.values()))
    assert SupAPParams.checked(**{**settings, "rho": 3}) == (0.01, 3.0, 1.44, 0.05, 0.5)
