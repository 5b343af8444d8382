"""LARS against a hand computation in float64."""

from __future__ import annotations

import math

import pytest
import torch

from rl_gap.optim import LARS, available_optimizers, build_optimizer, param_groups


def test_lars_two_steps_match_hand_computation():
    w = torch.nn.Parameter(torch.tensor([[3.0, 4.0]], dtype=torch.float64))  # ||w|| = 5
    b = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = LARS(
        [{"params": [w], "weight_decay": 0.5}, {"params": [b], "weight_decay": 0.0}],
        lr=0.1,
        momentum=0.9,
        trust_coefficient=0.01,
    )
    # Step 1: g_w = [0, 1], g_b = [2].
    w.grad = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    b.grad = torch.tensor([2.0], dtype=torch.float64)
    opt.step()
    # d = g + 0.5 w = [1.5, 3.0], ||d|| = sqrt(11.25); ratio = 0.01 * 5 / sqrt(11.25)
    ratio = 0.05 / math.sqrt(11.25)
    mu_w = [1.5 * ratio, 3.0 * ratio]
    w1 = [3.0 - 0.1 * mu_w[0], 4.0 - 0.1 * mu_w[1]]
    mu_b = 2.0  # 1-D: no decay, no trust ratio
    b1 = 1.0 - 0.1 * mu_b
    assert w.detach()[0].tolist() == pytest.approx(w1, abs=1e-15)
    assert b.item() == pytest.approx(b1, abs=1e-15)
    # Step 2: g_w = [1, 0], g_b = [-1].
    w.grad = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    b.grad = torch.tensor([-1.0], dtype=torch.float64)
    opt.step()
    d = [1.0 + 0.5 * w1[0], 0.5 * w1[1]]
    ratio2 = 0.01 * math.hypot(*w1) / math.hypot(*d)
    mu_w = [0.9 * mu_w[0] + d[0] * ratio2, 0.9 * mu_w[1] + d[1] * ratio2]
    w2 = [w1[0] - 0.1 * mu_w[0], w1[1] - 0.1 * mu_w[1]]
    b2 = b1 - 0.1 * (0.9 * mu_b - 1.0)
    assert w.detach()[0].tolist() == pytest.approx(w2, abs=1e-14)
    assert b.item() == pytest.approx(b2, abs=1e-14)


def test_lars_zero_weights_use_unit_ratio_and_registry():
    w = torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.float64))
    opt = LARS([w], lr=1.0, momentum=0.0, weight_decay=0.0)
    w.grad = torch.ones(2, 2, dtype=torch.float64)
    opt.step()
    assert torch.equal(w.detach(), -torch.ones(2, 2, dtype=torch.float64))
    assert "lars" in available_optimizers()
    model = torch.nn.Linear(3, 2)
    built = build_optimizer(
        "lars", param_groups([model], 1e-6), lr=0.6, weight_decay=1e-6, momentum=0.9
    )
    assert isinstance(built, LARS)
    assert {g["weight_decay"] for g in built.param_groups} == {1e-6, 0.0}
    with pytest.raises(ValueError, match="invalid LARS"):
        LARS([w], lr=-1.0)


def test_resnet_moco_step_with_lars_leaves_momentum_encoder_alone():
    from rl_gap.modules.moco_v3 import MoCoV3Module

    torch.manual_seed(0)
    module = MoCoV3Module(
        backbone="resnet10t",
        backbone_kwargs={"in_chans": 1},
        hidden_dim=32,
        embed_dim=8,
        optimizer="lars",
        lr=0.3,
        weight_decay=1e-6,
        loss={"name": "infonce", "temperature": 1.0, "symmetric": False},
    )
    optimizer = module.configure_optimizers()["optimizer"]
    assert isinstance(optimizer, LARS)
    assert module.loss_scale_value() == pytest.approx(2.0)  # 2τ at MoCo v3's ResNet τ = 1
    online_before = [p.detach().clone() for p in module.online.parameters()]
    momentum_before = [p.detach().clone() for p in module.momentum_encoder.parameters()]
    loss = module.two_view_loss(torch.randn(4, 1, 32, 32), torch.randn(4, 1, 32, 32))
    loss.backward()
    optimizer.step()
    assert any(not torch.equal(a, b) for a, b in zip(online_before, module.online.parameters()))
    for a, b in zip(momentum_before, module.momentum_encoder.parameters()):
        assert torch.equal(a, b)
