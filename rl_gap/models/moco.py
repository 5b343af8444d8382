"""MoCo v3 building blocks: timm backbone, projector/predictor MLPs, momentum encoder.

Chen, Xie & He, *An Empirical Study of Training Self-Supervised Vision
Transformers* (ICCV 2021). The online encoder is a backbone followed by a
projector MLP; a predictor MLP sits on top of it. The momentum (key) encoder
is a copy of backbone + projector whose weights follow an exponential moving
average of the online ones, with a coefficient that rises from ``m0`` to 1 on
a half-cosine over training.

Everything here is plain PyTorch (no Lightning), so it can be tested alone.
"""

from __future__ import annotations

import copy
import math

import timm
import torch
from torch import nn

import rl_gap.models.encoder  # noqa: F401  (registers rl_gap_convnet in timm)
from rl_gap.models.preprocess import timm_preprocess


def build_mlp(
    num_layers: int,
    input_dim: int,
    hidden_dim: int,
    output_dim: int,
    last_bn: bool = True,
    batchnorm: bool = True,
) -> nn.Sequential:
    """MoCo v3 MLP: (Linear → BN → ReLU) × (L−1), then Linear (→ BN without affine).

    Linear layers have no bias (BN follows them). The final BN without affine
    follows SimCLR's design, as in MoCo v3.

    Args:
        num_layers: number of Linear layers (≥ 1): 3 for the ViT projector,
            2 for the ResNet projector and for the predictor.
        input_dim, hidden_dim, output_dim: widths (MoCo v3: hidden 4096, out 256).
        last_bn: put a non-affine BatchNorm after the last Linear.
        batchnorm: ``False`` drops every BatchNorm (and gives the Linear layers a
            bias); used by tests that compare multi-process with single-process
            runs, since per-rank BN statistics differ without SyncBatchNorm.
    """
    if num_layers < 1:
        raise ValueError(f"an MLP needs at least one layer, got num_layers={num_layers}")
    layers: list[nn.Module] = []
    for index in range(num_layers):
        d_in = input_dim if index == 0 else hidden_dim
        last = index == num_layers - 1
        d_out = output_dim if last else hidden_dim
        layers.append(nn.Linear(d_in, d_out, bias=not batchnorm))
        if not last:
            if batchnorm:
                layers.append(nn.BatchNorm1d(d_out))
            layers.append(nn.ReLU(inplace=True))
        elif last_bn and batchnorm:
            layers.append(nn.BatchNorm1d(d_out, affine=False))
    return nn.Sequential(*layers)


def create_backbone(name: str, **kwargs) -> tuple[nn.Module, int]:
    """A randomly initialised timm model without classifier head.

    Args:
        name: any timm model name, e.g. ``vit_small_patch16_224``, ``resnet50``.
        **kwargs: forwarded to ``timm.create_model`` (``img_size``, ``patch_size``,
            ``depth``, ``num_heads``, ``in_chans``, ...).

    Returns:
        (backbone mapping images (B, C, H, W) to features (B, F), F); the backbone's
        ``preprocess`` attribute holds timm's data config of it (:mod:`rl_gap.models.preprocess`).
    """
    if not timm.is_model(name):
        raise ValueError(f"unknown timm model {name!r}")
    kwargs = dict(kwargs)
    kwargs.setdefault("num_classes", 0)
    backbone = timm.create_model(name, pretrained=False, **kwargs)
    # timm's data config of the architecture: what the DataModule feeds it by default
    backbone.preprocess = timm_preprocess(backbone, name)
    return backbone, int(backbone.num_features)


def is_vision_transformer(backbone: nn.Module) -> bool:
    """True for timm ViT-style backbones (patch embedding + position embedding)."""
    return hasattr(backbone, "patch_embed") and hasattr(backbone, "pos_embed")


def sincos_2d_position_embedding(
    grid_h: int, grid_w: int, dim: int, temperature: float = 10000.0
) -> torch.Tensor:
    """Fixed 2-D sine-cosine position embedding used by MoCo v3's ViTs.

    A quarter of the channels each hold sin/cos of the column and the row
    coordinate at geometrically spaced frequencies.

    Returns:
        (grid_h * grid_w, dim) float32, patches in row-major order (timm's).
    """
    if dim % 4 != 0:
        raise ValueError(f"sincos position embedding needs dim divisible by 4, got {dim}")
    rows, cols = torch.meshgrid(
        torch.arange(grid_h, dtype=torch.float32),
        torch.arange(grid_w, dtype=torch.float32),
        indexing="ij",
    )
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float32) / quarter)
    out_x = cols.flatten()[:, None] * omega[None]
    out_y = rows.flatten()[:, None] * omega[None]
    return torch.cat([out_x.sin(), out_x.cos(), out_y.sin(), out_y.cos()], dim=1)


def apply_moco_vit_tricks(
    backbone: nn.Module, freeze_patch_embed: bool, fixed_pos_embed: bool
) -> None:
    """MoCo v3's stabilisers for ViTs, in place.

    ``freeze_patch_embed``: the random patch projection is fixed (MoCo v3 §4.2,
    "random patch projection"; ``--stop-grad-conv1``): it is initialised
    uniformly with bound sqrt(6 / (3·p² + D)) (Xavier over the patch), bias 0,
    and excluded from gradients and the optimizer.
    ``fixed_pos_embed``: 2-D sin-cos position embedding, not learned; the class
    token's position entry is zero.
    """
    if not is_vision_transformer(backbone):
        if freeze_patch_embed or fixed_pos_embed:
            raise ValueError(
                "freeze_patch_embed / fixed_pos_embed apply to ViT backbones only "
                f"(got {type(backbone).__name__})"
            )
        return
    if freeze_patch_embed:
        proj = backbone.patch_embed.proj
        patch_area = math.prod(proj.weight.shape[2:])
        bound = math.sqrt(6.0 / float(3 * patch_area + proj.weight.shape[0]))
        with torch.no_grad():
            nn.init.uniform_(proj.weight, -bound, bound)
            if proj.bias is not None:
                proj.bias.zero_()
        for p in proj.parameters():
            p.requires_grad_(False)
    if fixed_pos_embed:
        pos = backbone.pos_embed
        grid_h, grid_w = backbone.patch_embed.grid_size
        num_prefix = pos.shape[1] - grid_h * grid_w
        table = sincos_2d_position_embedding(grid_h, grid_w, pos.shape[2])
        with torch.no_grad():
            pos[0, :num_prefix].zero_()
            pos[0, num_prefix:].copy_(table.to(pos.dtype))
        pos.requires_grad_(False)


class MoCoEncoder(nn.Module):
    """Backbone + projector; the online and the momentum branch share this shape.

    Args:
        backbone: images (B, C, H, W) -> features (B, F).
        projector: features (B, F) -> projections (B, E).
    """

    def __init__(self, backbone: nn.Module, projector: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.projector = projector

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Backbone features (B, F): what linear probing and kNN evaluate."""
        return self.backbone(images)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.projector(self.backbone(images))


def make_momentum_copy(encoder: nn.Module) -> nn.Module:
    """A deep copy with every parameter frozen (no gradients, no optimizer)."""
    target = copy.deepcopy(encoder)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


def momentum_coefficient(
    step: int, total_steps: int, base: float, schedule: str = "cosine"
) -> float:
    """MoCo v3's momentum at optimizer step ``step`` of ``total_steps``.

    ``cosine``: m(t) = 1 − (1 − m0)·(cos(π t / T) + 1) / 2, from m0 at t = 0 to
    1 at t = T (MoCo v3 ``--moco-m-cos``); ``constant``: m0 throughout.
    """
    if not 0.0 <= base <= 1.0:
        raise ValueError(f"momentum must lie in [0, 1], got {base}")
    if schedule == "constant":
        return float(base)
    if schedule != "cosine":
        raise ValueError(f"unknown momentum schedule {schedule!r}; known: cosine, constant")
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}")
    progress = min(max(step / total_steps, 0.0), 1.0)
    return 1.0 - (1.0 - base) * (math.cos(math.pi * progress) + 1.0) / 2.0


@torch.no_grad()
def momentum_update(online: nn.Module, target: nn.Module, momentum: float) -> None:
    """θ_target ← m·θ_target + (1 − m)·θ_online for every parameter pair.

    Buffers (BN running statistics) are left to the target's own forward
    passes, as in MoCo v3. The modules must have identical parameter lists.
    """
    online_params = list(online.parameters())
    target_params = list(target.parameters())
    if [p.shape for p in online_params] != [p.shape for p in target_params]:
        raise ValueError(
            f"online and momentum encoders differ in parameter shapes: "
            f"{len(online_params)} vs {len(target_params)} parameters"
        )
    if momentum == 1.0:
        return
    torch._foreach_mul_(target_params, momentum)
    torch._foreach_add_(target_params, [p.detach() for p in online_params], alpha=1.0 - momentum)
