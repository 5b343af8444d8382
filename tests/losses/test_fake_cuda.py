"""Every registered loss on (fake) CUDA inputs: forward and backward equal the CPU run."""

from __future__ import annotations

import pytest
import torch

from rl_gap.losses import build_loss

CONFIGS = [
    ("gsap", {"impl": "exact"}),
    ("gsap", {"impl": "exact", "neg_drop": 0.5}),
    ("gsap", {"impl": "fast"}),
    ("gsap", {"impl": "fast", "neg_drop": 0.5}),
    ("gsap", {"impl": "fast", "neg_drop": 0.9, "temperature": 0.05}),
    ("msap", {}),
    ("msap", {"neg_drop": 0.5, "symmetric": True}),
    ("infonce", {"symmetric": True, "learnable_scale": True}),
    ("siglip", {}),
    ("supap", {"neg_drop": 0.5}),
    ("gsupap", {"neg_drop": 0.5}),
    ("softbin", {"neg_drop": 0.5}),
    ("gsoftbin", {}),
    ("blackbox", {"neg_drop": 0.5}),
    ("gblackbox", {}),
]


def batch(seed: int = 0, n: int = 24):
    g = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(n, 8, generator=g, dtype=torch.float64), dim=1)
    labels = torch.arange(n) // 3
    sim = (emb @ emb.T).float()
    rel = labels[:, None] == labels[None, :]
    valid = ~torch.eye(n, dtype=torch.bool)
    return sim, rel & valid, valid


def run(name, kwargs, sim, rel, valid, device):
    torch.manual_seed(0)
    loss_fn = build_loss(name, **kwargs).to(device)
    x = sim.to(device).detach().requires_grad_(True)
    loss = loss_fn(x, rel.to(device), valid.to(device))
    loss.backward()
    params = [p.grad.cpu() for p in loss_fn.parameters() if p.grad is not None]
    return loss.detach(), x.grad, params


@pytest.mark.parametrize(("name", "kwargs"), CONFIGS, ids=lambda c: str(c))
def test_loss_on_cuda_equals_cpu(fake_cuda, name, kwargs):
    sim, rel, valid = batch()
    cpu_loss, cpu_grad, cpu_params = run(name, kwargs, sim, rel, valid, "cpu")
    loss, grad, params = run(name, kwargs, sim, rel, valid, "cuda")
    assert loss.is_cuda and grad.is_cuda
    torch.testing.assert_close(loss.cpu(), cpu_loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad.cpu(), cpu_grad, rtol=1e-5, atol=1e-7)
    for p, q in zip(params, cpu_params, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert cpu_grad.abs().sum() > 0  # the comparison is not between two zero gradients
