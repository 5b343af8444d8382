"""Shared by the CLIP tests: captions, a tiny CLIPFineTuneModule, a saved tiny checkpoint."""

from __future__ import annotations

import math

import pytest
import torch

from rl_gap.models.clip import CLIPEncoder, tiny_clip_config
from rl_gap.modules.clip_finetune import CLIPFineTuneModule

CAPTIONS = [
    "LATIN SMALL LETTER A WITH ACUTE",
    "DIGIT ONE",
    "GREEK CAPITAL LETTER OMEGA",
    "LATIN CAPITAL LETTER E WITH CARON",
]


def tiny_module(**kwargs) -> CLIPFineTuneModule:
    torch.manual_seed(0)
    kwargs.setdefault("loss", {"name": "gsap", "temperature": 0.05})
    return CLIPFineTuneModule(model_name=None, model_config=tiny_clip_config(), **kwargs)


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
    """A tiny open_clip state dict saved to disk, with a non-default logit scale."""
    torch.manual_seed(1)
    encoder = CLIPEncoder(None, tiny_clip_config())
    with torch.no_grad():
        encoder.model.logit_scale.fill_(math.log(42.0))
    path = tmp_path_factory.mktemp("ckpt") / "tiny_clip.pt"
    torch.save(encoder.model.state_dict(), path)
    return path, encoder
