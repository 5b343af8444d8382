"""CLIPEncoder / CLIPFineTuneModule on a tiny open_clip config (CPU, milliseconds)."""

from __future__ import annotations

import json
import math

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F

from rl_gap.models.clip import (
    CLIPEncoder,
    fill_template,
    resolve_model_config,
    tiny_clip_config,
)
from rl_gap.modules.clip_finetune import caption_group_relevance
from tests.models.clip_helpers import CAPTIONS, tiny_module


def test_tokenizer_is_open_clip_simple_tokenizer_offline():
    encoder = CLIPEncoder(None, tiny_clip_config(context_length=16))
    tokens = encoder.tokenize(CAPTIONS)
    reference = open_clip.tokenizer.SimpleTokenizer(context_length=16)(CAPTIONS)
    assert tokens.dtype == torch.long and tokens.shape == (4, 16)
    assert torch.equal(tokens, reference)


def test_embeddings_are_unit_norm_with_config_shapes():
    encoder = CLIPEncoder(None, tiny_clip_config(embed_dim=48))
    img = encoder.encode_image(torch.randn(3, 3, 32, 32))
    txt = encoder.encode_text(encoder.tokenize(CAPTIONS[:3]))
    assert img.shape == (3, 48) and txt.shape == (3, 48)
    torch.testing.assert_close(img.norm(dim=1), torch.ones(3))
    torch.testing.assert_close(txt.norm(dim=1), torch.ones(3))
    # Equals open_clip's own normalised features.
    raw = encoder.model.encode_image(torch.zeros(1, 3, 32, 32))
    torch.testing.assert_close(
        encoder.encode_image(torch.zeros(1, 3, 32, 32)), raw / raw.norm(dim=1, keepdim=True)
    )


def test_model_config_from_name_dict_and_json(tmp_path):
    assert resolve_model_config("ViT-B-32")["vision_cfg"]["patch_size"] == 32
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(tiny_clip_config(embed_dim=40)))
    encoder = CLIPEncoder(None, str(path))
    assert encoder.model.text_projection.shape[1] == 40 and encoder.image_size == 32
    with pytest.raises(ValueError, match="unknown open_clip model"):
        resolve_model_config("ViT-Nope-99")
    with pytest.raises(FileNotFoundError, match="config JSON not found"):
        resolve_model_config(None, str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="lacks key"):
        resolve_model_config(None, {"embed_dim": 8})
    with pytest.raises(ValueError, match="model_name"):
        resolve_model_config(None, None)


def test_infonce_scale_starts_from_pretrained_and_siglip_keeps_its_own(saved_checkpoint):
    path, _ = saved_checkpoint
    infonce = tiny_module(
        pretrained=str(path),
        loss={"name": "infonce", "learnable_scale": True, "symmetric": True, "temperature": 0.5},
    )
    assert infonce.loss_scale_from_pretrained
    assert float(infonce.loss_fn.log_logit_scale) == pytest.approx(math.log(42.0))
    fresh = tiny_module(loss={"name": "infonce", "learnable_scale": True, "temperature": 0.5})
    assert float(fresh.loss_fn.log_logit_scale) == pytest.approx(math.log(2.0))
    opted_out = tiny_module(
        pretrained=str(path),
        scale_from_pretrained=False,
        loss={"name": "infonce", "learnable_scale": True, "temperature": 0.5},
    )
    assert float(opted_out.loss_fn.log_logit_scale) == pytest.approx(math.log(2.0))
    siglip = tiny_module(pretrained=str(path), loss={"name": "siglip"})
    assert float(siglip.loss_fn.log_scale) == pytest.approx(math.log(10.0))
    assert float(siglip.loss_fn.bias) == pytest.approx(-10.0)
    # The model's own scale is not trained: the loss owns it.
    assert not infonce.clip.model.logit_scale.requires_grad


def test_tower_locking_and_optimizer_groups():
    module = tiny_module(lock_image=True)
    visual = [p.requires_grad for p in module.clip.model.visual.parameters()]
    assert not any(visual)
    assert module.clip.model.token_embedding.weight.requires_grad
    optimizer = module.configure_optimizers()
    optimizer = optimizer["optimizer"] if isinstance(optimizer, dict) else optimizer
    in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in in_optimizer for p in module.clip.model.visual.parameters())
    assert id(module.clip.model.token_embedding.weight) in in_optimizer
    # open_clip's groups from the end: 1 = projection, 2 = + last block and final norm.
    partly = tiny_module(lock_text=True, lock_text_unlocked_layers=2)
    blocks = partly.clip.model.transformer.resblocks
    assert not partly.clip.model.token_embedding.weight.requires_grad
    assert not any(p.requires_grad for p in blocks[0].parameters())
    assert all(p.requires_grad for p in blocks[-1].parameters())
    assert partly.clip.model.text_projection.requires_grad


def test_grad_checkpointing_passthrough_keeps_gradients():
    plain = tiny_module()
    ckpt = tiny_module(grad_checkpointing=True)
    assert ckpt.clip.model.transformer.grad_checkpointing
    assert ckpt.clip.model.visual.transformer.grad_checkpointing
    batch = {
        "image": torch.randn(4, 3, 32, 32),
        "text": CAPTIONS,
        "group": torch.arange(4),
    }
    for m in (plain, ckpt):
        m.train()
        sim, rel, valid = m.global_similarity(batch)
        m.loss_fn(sim, rel, valid).backward()
    g1 = plain.clip.model.visual.conv1.weight.grad
    g2 = ckpt.clip.model.visual.conv1.weight.grad
    torch.testing.assert_close(g1, g2, rtol=1e-4, atol=1e-6)


def test_global_similarity_matches_float64_reference():
    module = tiny_module()
    images = torch.randn(5, 3, 32, 32)
    captions = CAPTIONS + ["DIGIT ONE"]  # caption 1 and 4 describe the same group
    groups = torch.tensor([7, 3, 9, 1, 3])
    sim, rel, valid = module.global_similarity({"image": images, "text": captions, "group": groups})
    with torch.no_grad():
        img = module.clip.model.encode_image(images).double()
        txt = module.clip.model.encode_text(module.clip.tokenize(captions)).double()
    ref = F.normalize(img, dim=1) @ F.normalize(txt, dim=1).T
    assert sim.dtype == torch.float32 and valid is None
    torch.testing.assert_close(sim.double(), ref, rtol=0, atol=1e-5)
    expected = np.zeros((5, 5), dtype=bool)
    for i in range(5):
        for j in range(5):
            expected[i, j] = int(groups[i]) == int(groups[j])
    assert torch.equal(rel, torch.from_numpy(expected))
    assert int(rel.sum()) == 7  # 5 diagonal + (1, 4) + (4, 1)


def test_symmetric_infonce_step_equals_open_clip_cliploss(saved_checkpoint):
    """With distinct groups and the pretrained scale, the training loss is CLIP's."""
    path, _ = saved_checkpoint
    module = tiny_module(
        pretrained=str(path), loss={"name": "infonce", "learnable_scale": True, "symmetric": True}
    )
    images = torch.randn(4, 3, 32, 32)
    batch = {"image": images, "text": CAPTIONS, "group": torch.arange(4)}
    sim, rel, valid = module.global_similarity(batch)
    ours = module.loss_fn(sim, rel, valid)
    with torch.no_grad():
        img = module.clip.encode_image(images)
        txt = module.clip.encode_text(module.clip.tokenize(CAPTIONS))
    reference = open_clip.loss.ClipLoss()(img, txt, torch.tensor(42.0))
    torch.testing.assert_close(ours.detach(), reference, rtol=1e-5, atol=1e-6)


def test_caption_group_relevance():
    rel = caption_group_relevance(torch.tensor([0, 1]), torch.tensor([1, 0, 0]))
    assert rel.tolist() == [[False, True, True], [True, False, False]]


def test_fill_template_and_batch_errors():
    assert fill_template("a photo of a {}.", "cat") == "a photo of a cat."
    assert fill_template(lambda c: f"itap of a {c}.", "cat") == "itap of a cat."
    with pytest.raises(ValueError, match="placeholder"):
        fill_template("no slot", "cat")
    module = tiny_module()
    with pytest.raises(ValueError, match="missing 'group'"):
        module.global_similarity({"image": torch.randn(2, 3, 32, 32), "text": CAPTIONS[:2]})
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        module.clip.encode_image(torch.randn(2, 32, 32))


def test_export_open_clip_round_trip_carries_the_learnt_scale(tmp_path):
    module = tiny_module(loss={"name": "infonce", "learnable_scale": True, "temperature": 0.25})
    with torch.no_grad():
        module.loss_fn.log_logit_scale.fill_(math.log(7.0))
    path = tmp_path / "export.pt"
    module.export_open_clip(str(path))
    loaded = CLIPEncoder(None, tiny_clip_config(), pretrained=str(path))
    assert loaded.pretrained_logit_scale == pytest.approx(math.log(7.0))
    # open_clip itself reads the export.
    model = open_clip.model.CLIP(**tiny_clip_config())
    model.load_state_dict(torch.load(path, weights_only=True))
    tokens = module.clip.tokenize(CAPTIONS)
    torch.testing.assert_close(
        F.normalize(model.encode_text(tokens), dim=-1), module.clip.encode_text(tokens)
    )
