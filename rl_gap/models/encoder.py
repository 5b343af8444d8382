"""Image encoders for metric learning: a timm backbone + linear embedding head + L2 norm.

Any timm model name works as the backbone (``resnet50``,
``vit_base_patch16_224``, ...). Pretrained weights come by name through timm's own
download and cache (``pretrained: true`` with ``resnet50`` or ``resnet50.tv_in1k``;
or a Hub name, ``backbone: hf-hub:timm/resnet50.tv_in1k``; see
:mod:`rl_gap.models.pretrained`), or from a local file
(``weights: /data/resnet50_a1_in1k.safetensors``). This file also registers ``rl_gap_convnet``, a four-layer CNN in timm's
registry, so the CPU demo and the tests use the same code path as ResNet-50.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import timm
import torch
from timm.models import register_model
from torch import nn

from rl_gap.models.preprocess import CONVNET_PREPROCESS, timm_preprocess
from rl_gap.models.pretrained import (
    PretrainedWeightsUnavailable,
    fetching,
    hf_hub_cache,
    is_hub_name,
    torch_hub_checkpoints,
    weights_come_from_checkpoint,
)
from rl_gap.precision import full_precision_normalize

log = logging.getLogger(__name__)


class SmallConvNet(nn.Module):
    """Four 3x3 conv blocks (BN, ReLU, 2x2 max-pool after the first three) + global average pool.

    About 7.5 MFLOPs per 28x28 image: trains on MNIST in seconds per epoch on a CPU.
    Exposes timm's ``num_features`` and accepts ``num_classes`` (0 = features only).

    Args:
        in_chans: input channels.
        width: channels of the first block; doubled at each of the next two.
        num_classes: >0 adds a linear classifier; 0 returns pooled features (B, num_features).
    """

    def __init__(self, in_chans: int = 3, width: int = 32, num_classes: int = 0) -> None:
        super().__init__()
        chans = [in_chans, width, 2 * width, 4 * width, 4 * width]
        layers: list[nn.Module] = []
        for i in range(4):
            layers += [
                nn.Conv2d(chans[i], chans[i + 1], 3, padding=1, bias=False),
                nn.BatchNorm2d(chans[i + 1]),
                nn.ReLU(inplace=True),
            ]
            if i < 3:
                layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.num_features = chans[-1]
        self.num_classes = num_classes
        self.fc = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        # stated explicitly (timm's defaults for a config-less model would be bicubic): the
        # ImageNet statistics, bilinear resize and 0.875 crop this network has always used
        pp = CONVNET_PREPROCESS
        self.pretrained_cfg = {
            "input_size": (in_chans, pp.image_size, pp.image_size),
            "mean": pp.mean,
            "std": pp.std,
            "interpolation": pp.interpolation,
            "crop_pct": pp.crop_pct,
            "crop_mode": "center",
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean(dim=(2, 3)))


@register_model
def rl_gap_convnet(pretrained: bool = False, **kwargs: Any) -> SmallConvNet:
    """timm entry point of :class:`SmallConvNet` (no pretrained weights exist)."""
    if pretrained:
        raise ValueError("rl_gap_convnet has no pretrained weights; pass weights=<file> instead")
    allowed = {"in_chans", "width", "num_classes"}
    # timm's own plumbing (pretrained_cfg, cache_dir, ...) is dropped; a user's typo is not
    plumbing = {k for k in kwargs if k.startswith("pretrained_cfg") or k == "cache_dir"}
    unknown = sorted(set(kwargs) - allowed - plumbing)
    if unknown:
        raise ValueError(
            f"rl_gap_convnet has no argument(s) {', '.join(map(repr, unknown))} "
            f"(backbone_kwargs); it takes {', '.join(sorted(allowed - {'num_classes'}))}"
        )
    return SmallConvNet(**{k: v for k, v in kwargs.items() if k in allowed})


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a ``.safetensors``/``.pt``/``.pth``/``.bin`` state dict from a local file.

    Unwraps the usual ``{"state_dict": ...}``/``{"model": ...}`` containers.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"backbone weights file not found: {path} (expected a local .safetensors/.pth/.pt/.bin "
            "state dict of the timm model; for timm's own weights use pretrained=true or an "
            "hf-hub: backbone name)"
        )
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    obj = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model", "module"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
    if not isinstance(obj, dict):
        raise ValueError(f"{path} does not hold a state dict (got {type(obj).__name__})")
    return obj


def load_backbone_weights(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Copy matching tensors into ``model``; every model tensor must be present with its shape.

    Extra entries (an ImageNet classifier) are ignored. Missing or mis-shaped
    backbone tensors raise ``ValueError`` naming them: silently training from a
    half-loaded backbone is the failure this guards against.
    """
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    wrong = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in state and state[k].shape != own[k].shape
    ]
    if missing or wrong:
        raise ValueError(
            f"weights in {source} do not fit the backbone: missing {missing[:8]}"
            f"{' ...' if len(missing) > 8 else ''}; shape mismatches {wrong[:8]}"
        )
    extra = sorted(set(state) - set(own))
    if extra:
        log.info(
            "ignoring %d tensors from %s not in the backbone: %s", len(extra), source, extra[:5]
        )
    model.load_state_dict({k: state[k] for k in own}, strict=True)


def create_backbone(name: str, pretrained: bool, in_chans: int = 3, **kwargs: Any) -> nn.Module:
    """A timm model without classifier, random or with timm's pretrained weights.

    Pretrained weights are loaded by timm with its classifier in place (so its
    load is strict: every tensor of the checkpoint must fit), then the
    classifier is dropped.
    """
    if not is_hub_name(name) and not timm.is_model(name):
        raise ValueError(f"unknown timm backbone {name!r} (see timm.list_models())")
    if weights_come_from_checkpoint():  # the architecture alone; a checkpoint brings weights
        name, pretrained = registry_name(name), False
    if not pretrained:
        # hf-hub:timm/<registered name>: timm's registry has the architecture (no Hub config)
        with fetching(f"of the timm model {name!r}", [hf_hub_cache()]):  # other Hub configs
            return timm.create_model(
                registry_name(name), pretrained=False, num_classes=0, in_chans=in_chans, **kwargs
            )
    caches = [f"{hf_hub_cache()} (HF_HOME)", f"{torch_hub_checkpoints()} (TORCH_HOME)"]
    try:
        with fetching(f"of the timm model {name!r}", caches):
            model = timm.create_model(name, pretrained=True, in_chans=in_chans, **kwargs)
    except PretrainedWeightsUnavailable:
        # A cache filled through timm's own name (``resnet50.tv_in1k``) holds the weights of
        # ``hf-hub:timm/resnet50.tv_in1k`` but not the repository's config.json, which the Hub
        # name reads first; the registered name loads the same file of the same repository.
        registered = registry_name(name)
        if registered == name:
            raise
        with fetching(f"of the timm model {name!r}", caches):
            model = timm.create_model(registered, pretrained=True, in_chans=in_chans, **kwargs)
    model.reset_classifier(0)
    return model


def registry_name(name: str) -> str:
    """``hf-hub:timm/<name>`` as the timm registry name it was pushed from, when timm's own
    config of ``<name>`` points at that repository (no Hub look-up); any other name as given."""
    if not is_hub_name(name):
        return name
    repo = name.split(":", 1)[1]
    org, _, model = repo.partition("/")
    if org != "timm" or not timm.is_model(model):
        return name
    config = timm.models.get_pretrained_cfg(model)
    return model if config is not None and config.hf_hub_id == repo else name


class EmbeddingEncoder(nn.Module):
    """timm backbone -> linear head to ``dim`` -> L2 normalisation.

    Args:
        backbone: timm model name (``resnet50``, ``vit_base_patch16_224``, ``rl_gap_convnet``),
            optionally with a pretrained tag (``resnet50.tv_in1k``), or a Hugging Face Hub
            name (``hf-hub:timm/resnet50.tv_in1k``).
        dim: embedding size; 0 keeps the backbone's pooled features (no head).
        weights: local file with the backbone's pretrained weights, or None.
        in_chans: input image channels.
        backbone_kwargs: extra ``timm.create_model`` arguments (``drop_path_rate``, ``img_size``).

    Attributes:
        preprocess: timm's data config of the backbone (:mod:`rl_gap.models.preprocess`),
            which the DataModules follow unless a recipe overrides it.
        pretrained: load timm's pretrained weights for ``backbone`` (its default tag unless the
            name carries one) through timm's download and cache (``HF_HOME``, ``TORCH_HOME``).
            None (default): True for an ``hf-hub:`` name without ``weights``, else False.

    Shapes: ``forward(images (B, C, H, W)) -> (B, dim)`` with unit-norm rows,
    so ``a @ b.T`` is the cosine similarity used by every loss.
    """

    def __init__(
        self,
        backbone: str = "resnet50",
        dim: int = 512,
        weights: str | None = None,
        in_chans: int = 3,
        backbone_kwargs: dict[str, Any] | None = None,
        pretrained: bool | None = None,
    ) -> None:
        super().__init__()
        if weights and pretrained:
            raise ValueError(
                f"give either weights (a local file: {weights!r}) or pretrained=True "
                f"(timm's weights for {backbone!r}), not both"
            )
        if pretrained is None:
            pretrained = is_hub_name(backbone) and not weights
        self.backbone = create_backbone(
            backbone, pretrained, in_chans=in_chans, **(backbone_kwargs or {})
        )
        if weights and not weights_come_from_checkpoint():
            load_backbone_weights(self.backbone, load_state_dict_file(weights), str(weights))
        features = int(self.backbone.num_features)
        if dim < 0:
            raise ValueError(f"dim must be >= 0, got {dim}")
        self.dim = dim or features
        self.head = nn.Linear(features, dim) if dim else nn.Identity()
        # what the DataModule feeds it by default (rl_gap.data.preprocess)
        self.preprocess = timm_preprocess(self.backbone, backbone)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Unit-norm embeddings, normalised in float32 (float64 kept) even under autocast."""
        return full_precision_normalize(self.head(self.backbone(images)))
