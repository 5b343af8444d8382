"""open_clip weights: local checkpoint files, pretrained tags and Hub names.

Re-exported by :mod:`rl_gap.models.clip`, where :class:`~rl_gap.models.clip.CLIPEncoder`
uses them. A tag resolves through open_clip's own registry, download and cache;
inside :func:`rl_gap.models.pretrained.weights_from_checkpoint` no weight file is
named, and a tag's preprocessing comes from the registry alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import open_clip
import torch
from torch import nn

from rl_gap.models.pretrained import (
    fetching,
    hf_hub_cache,
    hub_offline,
    weights_come_from_checkpoint,
)

# Lightning checkpoints of CLIPFineTuneModule store the open_clip model under
# this attribute name; loading strips it so a fine-tuned run can seed another.
MODULE_PREFIXES = ("module.", "clip.model.", "model.")
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".npz")
OPEN_CLIP_URL_CACHE = "~/.cache/clip"  # open_clip's cache for weights that are not on the Hub
# the preprocessing a pretrained tag's registry entry states (open_clip's PreprocessCfg keys)
PREPROCESS_ENTRY_KEYS = ("mean", "std", "interpolation", "resize_mode")


def load_state_dict_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a checkpoint file into an open_clip-keyed state dict.

    Accepts a plain state dict, ``{"state_dict": ...}`` (open_clip training
    checkpoints and Lightning checkpoints of ``CLIPFineTuneModule``),
    ``.safetensors`` and OpenAI's TorchScript releases (``ViT-B-32.pt``). Prefixes ``module.`` (DDP) and ``clip.model.`` (this
    project's module) are stripped; other top-level entries (a loss's
    ``loss_fn.*`` parameters) are dropped.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"CLIP checkpoint not found: {path} (expected a local .pt/.bin/.ckpt/.safetensors "
            "file with an open_clip state dict, an open_clip pretrained tag such as 'openai', "
            "or an hf-hub: model name)"
        )
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path), device="cpu")
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except RuntimeError as err:
            # OpenAI's released CLIP files are TorchScript archives.
            try:
                state = torch.jit.load(str(path), map_location="cpu").state_dict()
            except RuntimeError:
                raise ValueError(
                    f"cannot read {path} as a state dict or TorchScript: {err}"
                ) from err
            for key in ("input_resolution", "context_length", "vocab_size"):
                state.pop(key, None)
    if isinstance(state, Mapping) and "state_dict" in state:
        state = state["state_dict"]
    if not isinstance(state, Mapping) or not state:
        raise ValueError(f"{path} holds no state dict (got {type(state).__name__})")
    for prefix in MODULE_PREFIXES:
        if any(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    return dict(state)


def load_clip_weights(model: nn.Module, path: str | os.PathLike) -> None:
    """Load a local checkpoint into an open_clip model (strict; pos-embeds resized).

    Raises:
        FileNotFoundError: missing file.
        ValueError: keys that do not match the architecture, listed.
    """
    state = load_state_dict_file(path)
    state = open_clip.convert.convert_state_dict(model, state)
    for name in ("logit_scale", "logit_bias"):
        target = getattr(model, name, None)
        if name in state and target is not None and state[name].ndim != target.ndim:
            state[name] = state[name].reshape(target.shape)
    if "logit_bias" not in state and getattr(model, "logit_bias", None) is not None:
        state["logit_bias"] = torch.zeros_like(model.logit_bias)
    open_clip.model.resize_pos_embed(state, model)
    open_clip.model.resize_text_pos_embed(state, model)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"checkpoint {path} does not match the model architecture: "
            f"missing {result.missing_keys[:8]}{'...' if len(result.missing_keys) > 8 else ''}, "
            f"unexpected {result.unexpected_keys[:8]}"
            f"{'...' if len(result.unexpected_keys) > 8 else ''}"
        )


def hub_model_source(
    model_name: str, with_weights: bool = True
) -> tuple[dict[str, Any], str | None, dict[str, Any]]:
    """(open_clip_config.json, weights file or None, preprocess config) of an
    ``hf-hub:org/repo`` name, through open_clip's Hub download (Hugging Face cache)."""
    repo = model_name.split(":", 1)[1]
    with fetching(f"of {model_name!r}", [f"{hf_hub_cache()} (HF_HOME)"]):
        config_file = open_clip.pretrained.download_pretrained_from_hf(
            repo, filename="open_clip_config.json"
        )
        weights = open_clip.pretrained.download_pretrained_from_hf(repo) if with_weights else None
    with open(config_file, encoding="utf-8") as f:
        full = json.load(f)
    return full, weights, dict(full.get("preprocess_cfg") or {})


def pretrained_tag_entry(
    model_name: str, tag: str, config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """open_clip's registry entry of ``tag`` for ``model_name`` (url/hf_hub, mean, std,
    quick_gelu), read without any download.

    Raises:
        ValueError: a tag open_clip does not know for this model, or a tag trained with
            QuickGELU on a config without it (the weights would load and compute wrongly).
    """
    entry = open_clip.get_pretrained_cfg(model_name, tag)
    if not entry:
        tags = open_clip.list_pretrained_tags_by_model(model_name)
        raise ValueError(
            f"unknown open_clip pretrained tag {tag!r} for model {model_name!r} "
            f"(its tags: {', '.join(tags) or 'none'}); or give a local checkpoint file"
        )
    if config is not None and bool(entry.get("quick_gelu", False)) != bool(
        config.get("quick_gelu", False)
    ):
        wanted = "with" if entry.get("quick_gelu") else "without"
        raise ValueError(
            f"open_clip pretrained tag {tag!r} was trained {wanted} QuickGELU but model "
            f"{model_name!r} is configured otherwise; use "
            f"{model_name.removesuffix('-quickgelu') + ('-quickgelu' if wanted == 'with' else '')!r}"
        )
    return dict(entry)


def pretrained_tag_file(
    model_name: str, tag: str, config: Mapping[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """The local file of open_clip's pretrained ``tag`` for ``model_name`` (downloaded into
    open_clip's cache if missing) and the tag's registry entry (:func:`pretrained_tag_entry`).

    Raises:
        ValueError: see :func:`pretrained_tag_entry`.
        PretrainedWeightsUnavailable: the weights are neither cached nor downloadable.
    """
    entry = pretrained_tag_entry(model_name, tag, config)
    on_hub = bool(entry.get("hf_hub")) and open_clip.pretrained.has_hf_hub()
    cache = f"{hf_hub_cache()} (HF_HOME)" if on_hub else os.path.expanduser(OPEN_CLIP_URL_CACHE)
    with fetching(f"{model_name} pretrained={tag!r}", [cache]):
        if not on_hub and hub_offline():  # open_clip's URL download ignores HF_HUB_OFFLINE
            target = os.path.join(cache, os.path.basename(entry.get("url", "")))
            if not os.path.isfile(target):
                raise FileNotFoundError(target)
        path = open_clip.pretrained.download_pretrained(dict(entry))
    return str(path), dict(entry)


def resolve_pretrained(
    model_name: str | None, pretrained: str | None, config: Mapping[str, Any] | None = None
) -> tuple[str | None, dict[str, Any]]:
    """(checkpoint file or None, preprocess settings) for ``pretrained``: a local file or
    an open_clip pretrained tag of ``model_name``. Inside ``weights_from_checkpoint`` no
    file is named (the checkpoint brings the weights), and a tag's preprocessing comes
    from open_clip's registry alone."""
    if not pretrained:
        return None, {}
    text = str(pretrained)
    path = Path(text).expanduser()
    from_checkpoint = weights_come_from_checkpoint()
    if path.is_file():
        return (None if from_checkpoint else str(path)), {}
    looks_like_path = (
        os.sep in text
        or "/" in text
        or text.startswith(("~", "."))
        or path.suffix in CHECKPOINT_SUFFIXES
    )
    if looks_like_path:
        if from_checkpoint:
            return None, {}
        load_state_dict_file(path)  # raises the missing-file error
    if model_name is None:
        raise ValueError(
            f"pretrained tag {text!r} needs an open_clip model_name (e.g. 'ViT-B-32'), "
            "or give a local checkpoint file"
        )
    if from_checkpoint:
        file, entry = None, pretrained_tag_entry(str(model_name), text, config)
    else:
        file, entry = pretrained_tag_file(str(model_name), text, config)
    return file, {k: entry[k] for k in PREPROCESS_ENTRY_KEYS if k in entry}
