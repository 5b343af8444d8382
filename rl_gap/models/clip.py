"""open_clip image–text encoders: build by name or config, load local weights, encode.

The gSAP paper's cross-modal protocol (§4, §C.1) fine-tunes a pretrained
OpenCLIP ViT-B/32 and swaps only the loss. This module wraps an open_clip
model so the training module sees two L2-normalised towers and nothing else:
the learnable logit scale / bias belong to the *loss* (docs/definitions.md), so the
open_clip model's own ``logit_scale`` is frozen and only read once, to start
InfoNCE's learnable scale from the pretrained value.

The architecture comes from open_clip's bundled configs (``ViT-B-32``), a
config dict / JSON file, or a Hub repository (``hf-hub:org/repo``, its
``open_clip_config.json``). Weights come from a local checkpoint file, an
open_clip pretrained tag (``openai``, ``laion2b_s34b_b79k``: open_clip's own
registry, download and cache), or the ``hf-hub:`` repository; the module
loads them strictly (every tensor must fit). The tokenizer is open_clip's
``SimpleTokenizer`` (its BPE vocabulary ships with the package) unless the
config names an HF tokenizer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from copy import deepcopy
from pathlib import Path
from typing import Any

import open_clip
import torch
import torch.nn.functional as F
from open_clip.transform import PreprocessCfg, merge_preprocess_dict
from torch import nn

from rl_gap.models.clip_weights import (  # noqa: F401  (public names of this module)
    CHECKPOINT_SUFFIXES,
    MODULE_PREFIXES,
    OPEN_CLIP_URL_CACHE,
    hub_model_source,
    load_clip_weights,
    load_state_dict_file,
    pretrained_tag_entry,
    pretrained_tag_file,
    resolve_pretrained,
)
from rl_gap.models.preprocess import open_clip_preprocess
from rl_gap.models.pretrained import is_hub_name, weights_come_from_checkpoint
from rl_gap.precision import full_precision_normalize

Tokenizer = Callable[..., torch.Tensor]


def resolve_model_config(
    model_name: str | None = None, model_config: Mapping[str, Any] | str | os.PathLike | None = None
) -> dict[str, Any]:
    """The open_clip architecture config as a dict.

    Args:
        model_name: a bundled open_clip config name (``"ViT-B-32"``, ``"RN50"``, ...).
        model_config: a config dict (``embed_dim``, ``vision_cfg``, ``text_cfg``)
            or the path of a JSON file holding one (open_clip's own format, or
            an ``open_clip_config.json`` with a ``model_cfg`` key). Takes
            precedence over ``model_name``.

    Raises:
        ValueError: neither given, unknown name, or a config missing keys.
        FileNotFoundError: a config path that does not exist.
    """
    if model_config is not None:
        if isinstance(model_config, str | os.PathLike):
            path = Path(model_config)
            if not path.is_file():
                raise FileNotFoundError(f"open_clip model config JSON not found: {path}")
            with open(path, encoding="utf-8") as f:
                model_config = json.load(f)
        config = deepcopy(dict(model_config))
        config = dict(config.get("model_cfg", config))
    elif model_name is not None:
        config = open_clip.get_model_config(model_name)
        if config is None:
            raise ValueError(
                f"unknown open_clip model {model_name!r}; bundled configs: "
                f"{', '.join(open_clip.list_models())}"
            )
    else:
        raise ValueError("give an open_clip model_name (e.g. 'ViT-B-32') or a model_config")
    missing = [k for k in ("embed_dim", "vision_cfg", "text_cfg") if k not in config]
    if missing:
        raise ValueError(
            f"open_clip model config lacks key(s) {missing}; got keys {sorted(config)}"
        )
    return config


def build_tokenizer(config: Mapping[str, Any]) -> Tokenizer:
    """open_clip's tokenizer for an architecture config (offline unless it names an HF one)."""
    text_cfg = dict(config["text_cfg"])
    context_length = int(text_cfg.get("context_length", 77))
    hf_name = text_cfg.get("hf_tokenizer_name")
    if hf_name:
        return open_clip.tokenizer.HFTokenizer(hf_name, context_length=context_length)
    tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=context_length)
    vocab_size = int(text_cfg.get("vocab_size", 49408))
    if vocab_size < tokenizer.vocab_size:
        raise ValueError(
            f"text_cfg.vocab_size={vocab_size} is smaller than the SimpleTokenizer's "
            f"{tokenizer.vocab_size} tokens; set vocab_size to {tokenizer.vocab_size}"
        )
    return tokenizer


def _image_size(config: Mapping[str, Any]) -> int:
    size = config["vision_cfg"].get("image_size", 224)
    if isinstance(size, Sequence):
        if len(set(size)) != 1:
            raise ValueError(f"only square images are supported, got image_size={size}")
        size = size[0]
    return int(size)


class CLIPEncoder(nn.Module):
    """An open_clip model seen as two normalised towers.

    Args:
        model_name: bundled open_clip architecture (``"ViT-B-32"``), or None
            when ``model_config`` is given.
        model_config: architecture dict or JSON path (see ``resolve_model_config``).
        pretrained: a local checkpoint file, an open_clip pretrained tag of ``model_name``
            (``openai``, ``laion2b_s34b_b79k``; fetched through open_clip's download and
            cache: ``HF_HOME``), or None for random initialisation. A ``model_name`` of
            the form ``hf-hub:org/repo`` brings its own config and weights.
        grad_checkpointing: activation checkpointing in both towers.

    Attributes:
        model: the open_clip ``CLIP`` / ``CustomTextCLIP``.
        tokenizer: callable ``list[str] -> LongTensor (N, context_length)``.
        preprocess: open_clip's preprocessing of the model (size, mean, std, interpolation,
            resize mode; :mod:`rl_gap.models.preprocess`), which the DataModule follows.
        image_size, mean, std: the same size and statistics.
        pretrained_logit_scale: the loaded checkpoint's ``logit_scale`` (log of
            1/τ, as open_clip stores it), or None without a checkpoint.
    """

    def __init__(
        self,
        model_name: str | None = "ViT-B-32",
        model_config: Mapping[str, Any] | str | None = None,
        pretrained: str | None = None,
        grad_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        if is_hub_name(model_name):
            if pretrained or model_config is not None:
                raise ValueError(
                    f"{model_name!r} names its own config and weights: leave pretrained and "
                    "model_config empty"
                )
            hub_config, checkpoint, preprocess = hub_model_source(
                str(model_name), with_weights=not weights_come_from_checkpoint()
            )
            config = resolve_model_config(None, hub_config)
        else:
            config = resolve_model_config(model_name, model_config)
            checkpoint, preprocess = resolve_pretrained(model_name, pretrained, config)
            if isinstance(model_config, Mapping):
                preprocess = {**dict(model_config.get("preprocess_cfg") or {}), **preprocess}
        self.config = deepcopy(config)
        self.tokenizer = build_tokenizer(config)
        custom_text = (
            bool(config.pop("custom_text", False)) or "hf_model_name" in config["text_cfg"]
        )
        model_cls = open_clip.model.CustomTextCLIP if custom_text else open_clip.model.CLIP
        if "hf_model_name" in config["text_cfg"]:
            config["text_cfg"]["hf_model_pretrained"] = False  # never download tower weights
        if "timm_model_name" in config["vision_cfg"]:
            config["vision_cfg"]["timm_model_pretrained"] = False
        config.pop("preprocess_cfg", None)
        self.model = model_cls(**config)
        self.pretrained_logit_scale: float | None = None
        if checkpoint:
            load_clip_weights(self.model, checkpoint)
            self.pretrained_logit_scale = float(self.model.logit_scale.detach().reshape(-1)[0])
        # The loss owns the scale (and bias); the model's copies stay as loaded.
        self.model.logit_scale.requires_grad_(False)
        if getattr(self.model, "logit_bias", None) is not None:
            self.model.logit_bias.requires_grad_(False)
        if grad_checkpointing:
            self.model.set_grad_checkpointing(True)
        self.image_size = _image_size(config)
        # as open_clip.create_model_and_transforms: its defaults, the architecture's
        # preprocess_cfg, then the pretrained tag's (or Hub repository's) values
        merged = merge_preprocess_dict(
            PreprocessCfg(), dict(self.config.get("preprocess_cfg") or {})
        )
        merged = merge_preprocess_dict(merged, preprocess)
        merged["size"] = self.image_size
        source = str(model_name or "the model_config") + (
            f" pretrained={pretrained}" if pretrained else ""
        )
        self.preprocess = open_clip_preprocess(merged, source)
        self.mean, self.std = self.preprocess.mean, self.preprocess.std

    def lock_image_tower(self, unlocked_groups: int = 0) -> None:
        """Freeze the image tower except its last ``unlocked_groups`` layer groups (LiT)."""
        self.model.lock_image_tower(unlocked_groups=unlocked_groups)

    def lock_text_tower(self, unlocked_layers: int = 0) -> None:
        """Freeze the text tower except its last ``unlocked_layers`` layers."""
        self.model.lock_text_tower(unlocked_layers=unlocked_layers)

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) float -> (B, E) unit-norm image embeddings (float32 under autocast)."""
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
        return full_precision_normalize(self.model.encode_image(images))

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, L) int64 tokens -> (B, E) unit-norm text embeddings (float32 under autocast)."""
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(
                f"tokens must be an int64 (B, L) tensor, got {tokens.dtype} {tuple(tokens.shape)}"
            )
        return full_precision_normalize(self.model.encode_text(tokens))

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        """Captions -> (N, context_length) int64 tokens."""
        if isinstance(texts, str):
            texts = [texts]
        return self.tokenizer(list(texts))

    @torch.no_grad()
    def class_embeddings(
        self,
        classnames: Sequence[str],
        templates: Sequence[str | Callable[[str], str]],
        batch_size: int = 256,
    ) -> torch.Tensor:
        """Zero-shot classifier weights (C, E): per class, the normalised mean of
        its normalised prompt embeddings (CLIP, Radford et al. 2021, §3.1.4)."""
        if not classnames or not templates:
            raise ValueError("zero-shot classification needs ≥1 class name and ≥1 template")
        prompts = [fill_template(t, c) for c in classnames for t in templates]
        device = next(self.model.parameters()).device
        chunks = []
        for start in range(0, len(prompts), batch_size):
            tokens = self.tokenize(prompts[start : start + batch_size]).to(device)
            chunks.append(self.encode_text(tokens).float())
        per_prompt = torch.cat(chunks).view(len(classnames), len(templates), -1)
        return F.normalize(per_prompt.mean(dim=1), dim=-1)


def fill_template(template: str | Callable[[str], str], classname: str) -> str:
    """A prompt from a template: a ``"{}"`` / ``"{c}"`` string or a callable."""
    if callable(template):
        return template(classname)
    if "{c}" in template:
        return template.replace("{c}", classname)
    if "{}" not in template:
        raise ValueError(f"prompt template {template!r} has no '{{}}' placeholder")
    return template.replace("{}", classname)


def tiny_clip_config(
    image_size: int = 32,
    patch_size: int = 8,
    embed_dim: int = 64,
    width: int = 64,
    layers: int = 2,
    context_length: int = 24,
) -> dict[str, Any]:
    """A small ViT/transformer open_clip config for CPU tests and the glyph demo."""
    return {
        "embed_dim": embed_dim,
        "vision_cfg": {
            "image_size": image_size,
            "layers": layers,
            "width": width,
            "head_width": 32,
            "patch_size": patch_size,
        },
        "text_cfg": {
            "context_length": context_length,
            "vocab_size": 49408,
            "width": width,
            "heads": max(1, width // 32),
            "layers": layers,
        },
    }
