"""open_clip weights from local files: state dicts, Lightning checkpoints of the module,
OpenAI's TorchScript archives; strict loading (tags and Hub names: test_pretrained.py)."""

from __future__ import annotations

import math

import pytest
import torch

from rl_gap.models.clip import CLIPEncoder, tiny_clip_config
from rl_gap.models.clip_weights import load_state_dict_file
from tests.models.clip_helpers import CAPTIONS, tiny_module


def test_loads_weights_from_local_checkpoint(saved_checkpoint):
    path, source = saved_checkpoint
    torch.manual_seed(123)  # a different random init, overwritten by the checkpoint
    loaded = CLIPEncoder(None, tiny_clip_config(), pretrained=str(path))
    for (name, p), q in zip(source.model.state_dict().items(), loaded.model.state_dict().values()):
        assert torch.equal(p, q), name
    assert loaded.pretrained_logit_scale == pytest.approx(math.log(42.0))
    tokens = source.tokenize(CAPTIONS)
    torch.testing.assert_close(loaded.encode_text(tokens), source.encode_text(tokens))


def test_checkpoint_errors(tmp_path, saved_checkpoint):
    with pytest.raises(FileNotFoundError, match="CLIP checkpoint not found"):
        CLIPEncoder(None, tiny_clip_config(), pretrained=str(tmp_path / "nope.pt"))
    path, _ = saved_checkpoint
    with pytest.raises(ValueError, match="does not match the model architecture"):
        CLIPEncoder(None, tiny_clip_config(layers=3), pretrained=str(path))


def test_lightning_checkpoint_of_the_module_seeds_a_new_run(tmp_path, saved_checkpoint):
    path, source = saved_checkpoint
    module = tiny_module(pretrained=str(path), loss={"name": "infonce", "learnable_scale": True})
    ckpt = tmp_path / "run.ckpt"
    torch.save({"state_dict": module.state_dict(), "epoch": 3}, ckpt)
    state = load_state_dict_file(ckpt)
    assert set(state) == set(source.model.state_dict())  # loss_fn.* dropped, prefix stripped
    again = CLIPEncoder(None, tiny_clip_config(), pretrained=str(ckpt))
    tokens = source.tokenize(CAPTIONS)
    torch.testing.assert_close(again.encode_text(tokens), source.encode_text(tokens))


def test_openai_torchscript_checkpoint(tmp_path, saved_checkpoint):
    """OpenAI's releases are TorchScript archives holding the CLIP state dict."""
    _, source = saved_checkpoint

    class Holder(torch.nn.Module):
        def __init__(self, state):
            super().__init__()
            for k, v in state.items():
                self.register_buffer(k.replace(".", "__"), v.clone())

        def forward(self, x):
            return x

    # A scripted module whose state dict keys are the open_clip names.
    scripted = torch.jit.script(Holder(source.model.state_dict()))
    jit_path = tmp_path / "openai.pt"
    scripted.save(str(jit_path))
    state = load_state_dict_file(jit_path)
    assert len(state) == len(source.model.state_dict())
