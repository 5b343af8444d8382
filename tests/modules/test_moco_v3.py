"""MoCo v3 module: momentum schedule/update, loss assembly, optimizer exclusion, ViT tricks."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from rl_gap.losses import build_loss
from rl_gap.models.moco import (
    apply_moco_vit_tricks,
    build_mlp,
    create_backbone,
    momentum_coefficient,
    momentum_update,
    sincos_2d_position_embedding,
)
from rl_gap.modules.moco_v3 import MoCoV3Module

TINY_VIT = dict(img_size=8, patch_size=4, in_chans=1, depth=1, embed_dim=16, num_heads=2)


TINY_KWARGS = dict(
    backbone="vit_tiny_patch16_224",
    backbone_kwargs=TINY_VIT,
    hidden_dim=32,
    embed_dim=8,
    loss={"name": "infonce", "temperature": 0.2, "symmetric": False},
    lr=1e-2,
    weight_decay=0.1,
    warmup=0,
    retrieval_max_queries=0,
)


def tiny_module(**overrides) -> MoCoV3Module:
    return MoCoV3Module(**{**TINY_KWARGS, **overrides})


class FixedViews(Dataset):
    """n images with two fixed 'views' each (no randomness)."""

    def __init__(self, n: int = 16, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x1 = torch.randn(n, 1, 8, 8, generator=g)
        self.x2 = self.x1 + 0.3 * torch.randn(n, 1, 8, 8, generator=g)

    def __len__(self) -> int:
        return len(self.x1)

    def __getitem__(self, i):
        return {"views": [self.x1[i], self.x2[i]], "label": i % 3}


# ----------------------------------------------------------- momentum schedule
def test_momentum_coefficient_hand_values():
    # m(t) = 1 - (1 - m0)(cos(pi t / T) + 1) / 2, m0 = 0.99, T = 8
    assert momentum_coefficient(0, 8, 0.99) == pytest.approx(0.99, abs=1e-15)
    assert momentum_coefficient(4, 8, 0.99) == pytest.approx(0.995, abs=1e-15)
    assert momentum_coefficient(8, 8, 0.99) == pytest.approx(1.0, abs=1e-15)
    # t/T = 1/4: cos(pi/4) = 0.70710678118...; 1 - 0.01 * 1.70710678118 / 2
    assert momentum_coefficient(2, 8, 0.99) == pytest.approx(0.99146446609406726, abs=1e-14)
    assert momentum_coefficient(6, 8, 0.99) == pytest.approx(0.99853553390593274, abs=1e-14)
    assert momentum_coefficient(3, 8, 0.996, "constant") == 0.996
    with pytest.raises(ValueError, match="schedule"):
        momentum_coefficient(0, 8, 0.99, "linear")
    with pytest.raises(ValueError, match="momentum"):
        momentum_coefficient(0, 8, 1.5)


def test_momentum_update_hand_computation():
    online = nn.Linear(2, 1).double()
    target = nn.Linear(2, 1).double()
    with torch.no_grad():
        online.weight.copy_(torch.tensor([[1.0, -2.0]]))
        online.bias.fill_(4.0)
        target.weight.copy_(torch.tensor([[3.0, 0.5]]))
        target.bias.fill_(-1.0)
    momentum_update(online, target, 0.9)
    # 0.9 * target + 0.1 * online
    assert target.weight[0].tolist() == pytest.approx([2.8, 0.25], abs=1e-15)
    assert target.bias.tolist() == pytest.approx([-0.5], abs=1e-15)
    with pytest.raises(ValueError, match="differ"):
        momentum_update(online, nn.Linear(3, 3), 0.9)


def _plain_momentum(step: int, total: int, m0: float) -> float:
    return 1 - (1 - m0) * (math.cos(math.pi * step / total) + 1) / 2


class _RecordingMoCo(MoCoV3Module):
    """Records both encoders right after the module's own batch-end hook."""

    def on_train_batch_end(self, outputs, batch, batch_idx):
        super().on_train_batch_end(outputs, batch, batch_idx)
        self.rows.append(
            dict(
                step=self.trainer.global_step,
                online=[p.detach().clone() for p in self.online.parameters()],
                target=[p.detach().clone() for p in self.momentum_encoder.parameters()],
            )
        )


def test_momentum_updates_once_per_optimizer_step_under_accumulation():
    torch.manual_seed(0)
    # accumulation is a different objective for the loss; this test is about the momentum only
    module = _RecordingMoCo(**{**TINY_KWARGS, "momentum": 0.9, "allow_split_batch": True})
    module.rows = []
    initial = [p.detach().clone() for p in module.momentum_encoder.parameters()]
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        accumulate_grad_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, DataLoader(FixedViews(16), batch_size=4))  # 4 batches, 2 steps
    rows = module.rows
    assert [r["step"] for r in rows] == [0, 1, 1, 2]
    total = 2
    # Batch 0: no optimizer step yet -> momentum encoder untouched.
    for before, after in zip(initial, rows[0]["target"]):
        assert torch.equal(before, after)
    # Batch 1 (step 1): target = m(1/2) target0 + (1 - m) online_1.
    m1 = _plain_momentum(1, total, 0.9)
    for t0, o1, t1 in zip(initial, rows[1]["online"], rows[1]["target"]):
        torch.testing.assert_close(t1, m1 * t0 + (1 - m1) * o1, rtol=1e-6, atol=1e-7)
    # Batch 2 accumulates: unchanged again.
    for a, b in zip(rows[1]["target"], rows[2]["target"]):
        assert torch.equal(a, b)
    # Batch 3 (step 2 = T): m = 1, the target stays.
    assert _plain_momentum(2, total, 0.9) == 1.0
    for a, b in zip(rows[2]["target"], rows[3]["target"]):
        torch.testing.assert_close(a, b)
    # The online encoder did move.
    assert any(not torch.equal(a, b) for a, b in zip(rows[0]["online"], rows[3]["online"]))


# ------------------------------------------------------------- loss assembly
def _moco_v3_reference(q1, q2, k1, k2, tau):
    """MoCo v3's loss, written plainly (one process, labels = arange(N))."""

    def ctr(q, k):
        q = q / q.norm(dim=1, keepdim=True)
        k = k / k.norm(dim=1, keepdim=True)
        logits = q @ k.T / tau
        labels = torch.arange(q.shape[0])
        return nn.functional.cross_entropy(logits, labels) * (2 * tau)

    return ctr(q1, k2) + ctr(q2, k1)


def test_infonce_two_view_loss_equals_moco_v3_reference_values_and_grads():
    torch.manual_seed(0)
    module = tiny_module().double()
    x1 = torch.randn(6, 1, 8, 8, dtype=torch.float64)
    x2 = torch.randn(6, 1, 8, 8, dtype=torch.float64)
    assert module.loss_scale_value() == pytest.approx(0.4)

    loss = module.two_view_loss(x1, x2)
    loss.backward()
    grads = [p.grad.clone() for p in module.predictor.parameters()]
    module.zero_grad()

    q1, q2 = module.queries(x1), module.queries(x2)
    with torch.no_grad():
        k1, k2 = module.momentum_encoder(x1), module.momentum_encoder(x2)
    reference = _moco_v3_reference(q1, q2, k1, k2, 0.2)
    reference.backward()
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-12)
    for g, p in zip(grads, module.predictor.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-10, atol=1e-12)
    # Keys carry no gradient: the momentum encoder gets none.
    assert all(p.grad is None for p in module.momentum_encoder.parameters())


def test_gsap_two_view_loss_is_the_registry_loss_on_both_view_pairs():
    torch.manual_seed(1)
    cfg = {"name": "gsap", "temperature": 0.05}
    module = tiny_module(loss=cfg).double()
    assert module.loss_scale_value() == 1.0
    x1 = torch.randn(5, 1, 8, 8, dtype=torch.float64)
    x2 = torch.randn(5, 1, 8, 8, dtype=torch.float64)
    loss = module.two_view_loss(x1, x2)
    gsap = build_loss("gsap", temperature=0.05)
    with torch.no_grad():
        q1, q2 = module.queries(x1), module.queries(x2)
        k1, k2 = module.momentum_encoder(x1), module.momentum_encoder(x2)
    eye = torch.eye(5, dtype=torch.bool)

    def cos(a, b):
        return (a / a.norm(dim=1, keepdim=True)) @ (b / b.norm(dim=1, keepdim=True)).T

    expected = gsap(cos(q1, k2), eye) + gsap(cos(q2, k1), eye)
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-10, atol=1e-12)
    # An explicit 2tau scale uses the gsap temperature.
    assert tiny_module(loss=cfg, loss_scale="2tau").loss_scale_value() == pytest.approx(0.1)
    assert tiny_module(loss=cfg, loss_scale=3.0).loss_scale_value() == 3.0


def test_similarity_is_float32_under_bf16_autocast():
    module = tiny_module()
    q, k = torch.randn(4, 8), torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sim, rel = module.pair_similarity(q.bfloat16(), k.bfloat16())
    assert sim.dtype == torch.float32
    expected = torch.nn.functional.normalize(q.bfloat16().float(), dim=1)
    expected = expected @ torch.nn.functional.normalize(k.bfloat16().float(), dim=1).T
    torch.testing.assert_close(sim, expected)


def test_global_similarity_block_diagonal():
    module = tiny_module().double()
    batch = {"views": [torch.randn(3, 1, 8, 8).double(), torch.randn(3, 1, 8, 8).double()]}
    sim, rel, valid = module.global_similarity(batch)
    assert sim.shape == rel.shape == valid.shape == (6, 6)
    assert valid[:3, :3].all() and valid[3:, 3:].all() and not valid[:3, 3:].any()
    assert torch.equal(rel, torch.eye(6, dtype=torch.bool))
    # InfoNCE on the block matrix = mean of the two view-pair losses.
    loss = module.loss_fn(sim, rel, valid)
    total = module.two_view_loss(*batch["views"]) / module.loss_scale_value()
    torch.testing.assert_close(loss, total / 2, rtol=1e-10, atol=1e-12)


def test_bad_inputs_raise():
    module = tiny_module()
    with pytest.raises(ValueError, match="two views"):
        module.training_step({"views": [torch.randn(2, 1, 8, 8)] * 3}, 0)
    with pytest.raises(ValueError, match="loss_scale"):
        tiny_module(loss_scale="tau")
    with pytest.raises(ValueError, match="unknown timm model"):
        create_backbone("no_such_model_xyz")
    with pytest.raises(ValueError, match="ViT"):
        apply_moco_vit_tricks(nn.Linear(2, 2), freeze_patch_embed=True, fixed_pos_embed=False)


# ------------------------------------------------- optimizer / frozen parts
def test_momentum_encoder_and_frozen_patch_embed_excluded_from_optimizer():
    module = tiny_module(freeze_patch_embed=True, fixed_pos_embed=True)
    optimizer = module.configure_optimizers()["optimizer"]
    in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in in_optimizer for p in module.momentum_encoder.parameters())
    assert all(not p.requires_grad for p in module.momentum_encoder.parameters())
    vit = module.online.backbone
    frozen = [vit.patch_embed.proj.weight, vit.patch_embed.proj.bias, vit.pos_embed]
    assert not any(id(p) in in_optimizer for p in frozen)
    assert id(module.predictor[0].weight) in in_optimizer
    assert id(vit.blocks[0].attn.qkv.weight) in in_optimizer
    # 1-D parameters get no weight decay.
    for g in optimizer.param_groups:
        if any(p.ndim < 2 for p in g["params"]):
            assert g["weight_decay"] == 0.0


def test_vit_tricks_patch_init_and_sincos_table():
    torch.manual_seed(0)
    vit, _ = create_backbone("vit_tiny_patch16_224", **TINY_VIT)
    apply_moco_vit_tricks(vit, freeze_patch_embed=True, fixed_pos_embed=True)
    bound = math.sqrt(6.0 / (3 * 4 * 4 + 16))
    w = vit.patch_embed.proj.weight
    assert w.abs().max() <= bound and w.abs().max() > 0.8 * bound
    assert torch.equal(vit.patch_embed.proj.bias, torch.zeros(16))
    # Hand table: grid 2x2 (row-major), dim 16 -> 4 frequencies 10000^(-i/4).
    expected = torch.zeros(5, 16, dtype=torch.float64)  # cls row stays 0
    for row in range(2):
        for col in range(2):
            token = 1 + row * 2 + col
            for i in range(4):
                omega = 1.0 / 10000 ** (i / 4)
                expected[token, i] = math.sin(col * omega)
                expected[token, 4 + i] = math.cos(col * omega)
                expected[token, 8 + i] = math.sin(row * omega)
                expected[token, 12 + i] = math.cos(row * omega)
    torch.testing.assert_close(vit.pos_embed[0].double(), expected, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="divisible by 4"):
        sincos_2d_position_embedding(2, 2, 6)


def test_mlp_shapes_follow_moco_v3():
    mlp = build_mlp(3, 16, 32, 8)
    kinds = [type(m).__name__ for m in mlp]
    assert kinds == [
        "Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d",
    ]  # fmt: skip
    assert mlp[-1].affine is False and mlp[0].bias is None
    assert [type(m).__name__ for m in build_mlp(2, 8, 32, 8, last_bn=False)] == [
        "Linear", "BatchNorm1d", "ReLU", "Linear",
    ]  # fmt: skip
    resnet = MoCoV3Module(
        backbone="resnet10t", backbone_kwargs={"in_chans": 1}, hidden_dim=32, embed_dim=8
    )
    # ResNet: 2-layer projector, predictor without the last BN.
    assert sum(isinstance(m, nn.Linear) for m in resnet.online.projector) == 2
    assert not isinstance(resnet.predictor[-1], nn.BatchNorm1d)
    vit = tiny_module()
    assert sum(isinstance(m, nn.Linear) for m in vit.online.projector) == 3
    assert isinstance(vit.predictor[-1], nn.BatchNorm1d)


def test_moco_defaults_show_in_print_config():
    from tests.modules.module_defaults import printed_init_args

    shown = printed_init_args("rl_gap.modules.moco_v3.MoCoV3Module")
    # MoCo v3: AdamW, base lr 1.5e-4, weight decay 0.1, encoder momentum 0.99
    assert (shown["optimizer"], shown["lr"], shown["weight_decay"]) == ("adamw", 1.5e-4, 0.1)
    assert (shown["momentum"], shown["momentum_sgd"]) == (0.99, 0.9)


def test_momentum_is_the_encoders_and_momentum_sgd_the_optimizers():
    module = MoCoV3Module(**TINY_KWARGS, momentum=0.95, optimizer="sgd", momentum_sgd=0.8)
    assert module.base_momentum == 0.95
    assert module.optimizer_settings.momentum == 0.8
    optimizer = module.configure_optimizers()["optimizer"]
    assert {g["momentum"] for g in optimizer.param_groups} == {0.8}
    # an old recipe's `momentum: 0.99` stays the encoder's coefficient, never SGD's
    module = MoCoV3Module(**TINY_KWARGS, momentum=0.99, optimizer="sgd")
    assert (module.base_momentum, module.optimizer_settings.momentum) == (0.99, 0.9)
