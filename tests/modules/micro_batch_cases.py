"""Tiny modules, batches and independent full-batch references for the micro-batch tests.

A reference step never goes through ``step_embeddings``, ``training_step`` or the
gradient cache: it calls the module's public encoders with autograd on, forms the
similarity matrices by hand and applies the loss, then one ``backward``. With dropout
the encoders are called micro-batch by micro-batch in the order the cached step's
first pass calls them (so both draw the same masks from the same RNG stream), and the
outputs are concatenated with autograd: the full-batch step with those masks.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.nn import functional as F

from rl_gap.models.clip import tiny_clip_config
from rl_gap.modules.clip_finetune import CLIPFineTuneModule
from rl_gap.modules.metric_learning import MetricLearningModule
from rl_gap.modules.moco_v3 import MoCoV3Module
from rl_gap.precision import widen
from tests.modules.ddp_steps import grads  # noqa: F401  (re-exported for the micro-batch tests)

N = 8
TINY_VIT = dict(img_size=8, patch_size=4, depth=1, embed_dim=16, num_heads=2)
DROPOUT_VIT = dict(proj_drop_rate=0.2, attn_drop_rate=0.2, drop_rate=0.1)
CAPTIONS = ["LETTER A", "DIGIT ONE", "ALPHA", "E WITH CARON", "SMALL A", "TWO", "OMEGA", "CARON"]
GROUPS = [0, 1, 2, 3, 0, 5, 6, 3]
LABELS = [0, 1, 2, 0, 1, 2, 0, 1]
SGD = dict(optimizer="sgd", lr=0.1, weight_decay=0.0, scheduler="none")
LOSSES = {
    "gsap": {"temperature": 0.05, "neg_drop": 0.3},
    "infonce": {"learnable_scale": True, "temperature": 0.2},
    "siglip": {},
}


def make_module(kind: str, loss: str, dtype=torch.float64, dropout=False, **settings) -> nn.Module:
    """A seeded tiny module of ``kind`` (metric, clip, moco) with the given loss and settings."""
    torch.manual_seed(0)
    loss_section = {"name": loss, **LOSSES.get(loss, {})}
    drop = DROPOUT_VIT if dropout else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "metric":
            module = MetricLearningModule(
                backbone="vit_tiny_patch16_224", backbone_kwargs={**TINY_VIT, **drop}, dim=6,
                in_chans=1, eval_plots=False, loss=loss_section, **SGD, **settings,
            )  # fmt: skip
        elif kind == "clip":
            config = tiny_clip_config(width=32, layers=1, context_length=16)
            if dropout:
                config["vision_cfg"]["patch_dropout"] = 0.5
            module = CLIPFineTuneModule(
                model_name=None, model_config=config, loss=loss_section, momentum=0.0,
                **SGD, **settings,
            )  # fmt: skip
        else:
            module = MoCoV3Module(
                backbone="vit_tiny_patch16_224", backbone_kwargs={**TINY_VIT, "in_chans": 1, **drop},
                hidden_dim=16, embed_dim=6, mlp_batchnorm=False, loss=loss_section,
                **SGD, **settings,
            )  # fmt: skip
    return module.to(dtype).train()


def make_batch(kind: str, rows: slice = slice(0, N), dtype=torch.float64):
    gen = torch.Generator().manual_seed(1)
    if kind == "metric":
        images = torch.randn(N, 1, 8, 8, generator=gen, dtype=dtype)
        return images[rows], torch.tensor(LABELS)[rows], torch.arange(N)[rows]
    if kind == "clip":
        images = torch.randn(N, 3, 32, 32, generator=gen, dtype=dtype)
        return {"image": images[rows], "text": CAPTIONS[rows], "group": torch.tensor(GROUPS)[rows]}
    views = torch.randn(2, N, 1, 8, 8, generator=gen, dtype=dtype)
    return {"views": [views[0, rows], views[1, rows]]}


def chunks(n: int, size: int | None) -> list[slice]:
    size = size or n
    return [slice(s, min(s + size, n)) for s in range(0, n, size)]


def reference_loss(
    module: nn.Module, kind: str, batch, size: int | None, bf16: bool = False
) -> torch.Tensor:
    """The full-batch loss by hand, encoders called per micro-batch of ``size`` (None: one
    call); ``bf16``: encoders under bf16 autocast, similarities and loss in float32."""
    loss_fn = module.loss_fn
    pieces = []
    for rows in chunks(N, size):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            pieces.append(_encode(module, kind, batch, rows))
    parts = [widen(torch.cat(column)) for column in zip(*pieces)]  # bf16 -> float32
    if kind == "metric":
        (emb,) = parts
        labels = batch[1]
        valid = ~torch.eye(N, dtype=torch.bool)
        return loss_fn(emb @ emb.T, labels[:, None] == labels[None, :], valid)
    if kind == "clip":
        image, text = parts
        groups = batch["group"]
        return loss_fn(image @ text.T, groups[:, None] == groups[None, :], None)
    q1, q2, k1, k2 = (F.normalize(p, dim=1) for p in parts)
    eye = torch.eye(N, dtype=torch.bool)
    scale = module.loss_scale_value()
    return scale * loss_fn(q1 @ k2.T, eye, None) + scale * loss_fn(q2 @ k1.T, eye, None)


def _encode(module: nn.Module, kind: str, batch, rows: slice) -> tuple[torch.Tensor, ...]:
    if kind == "metric":
        return (module.encoder(batch[0][rows]),)
    if kind == "clip":
        tokens = module.clip.tokenize(batch["text"][rows])
        image = F.normalize(widen(module.clip.model.encode_image(batch["image"][rows])), dim=-1)
        text = F.normalize(widen(module.clip.model.encode_text(tokens)), dim=-1)
        return image, text
    x1, x2 = (v[rows] for v in batch["views"])
    q1, q2 = module.predictor(module.online(x1)), module.predictor(module.online(x2))
    with torch.no_grad():
        k1, k2 = module.momentum_encoder(x1), module.momentum_encoder(x2)
    return q1, q2, k1, k2


def max_rel_diff(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """max over parameters of ‖got − want‖ / ‖want‖ (absolute where ‖want‖ = 0)."""
    assert set(got) == set(want), set(got) ^ set(want)
    worst = 0.0
    for name, w in want.items():
        diff = float((got[name].double() - w.double()).norm())
        scale = float(w.double().norm())
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst
