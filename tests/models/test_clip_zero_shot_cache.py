"""Zero-shot prompts are encoded once while the text tower is unchanged, under the trainer's
mixed precision, and the cached classifier equals a fresh float64 computation."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from rl_gap.models.clip import tiny_clip_config
from rl_gap.modules.clip_finetune import CLIPFineTuneModule

NAMES, TEMPLATES = ["red", "green", "blue"], ["{}", "a {}"]


def reference_classifier(module):
    """Mean of the unit prompt embeddings per class, renormalised, in float64."""
    prompts = [t.replace("{}", n) for n in NAMES for t in TEMPLATES]
    with torch.no_grad():
        per_prompt = module.clip.encode_text(module.clip.tokenize(prompts)).double()
    mean = per_prompt.view(len(NAMES), len(TEMPLATES), -1).mean(1)
    return mean / mean.norm(dim=1, keepdim=True)


@pytest.fixture
def module(monkeypatch):
    torch.manual_seed(0)
    module = CLIPFineTuneModule(
        model_name=None, model_config=tiny_clip_config(width=32, context_length=16)
    ).eval()
    calls = []
    encode = module.clip.encode_text

    def counting(tokens):
        calls.append(torch.is_autocast_enabled("cpu"))
        return encode(tokens)

    monkeypatch.setattr(module.clip, "encode_text", counting)
    module.calls = calls
    return module


def test_cached_until_the_text_tower_changes(module):
    first = module.zero_shot_classifier(NAMES, TEMPLATES)
    torch.testing.assert_close(first.double(), reference_classifier(module), atol=1e-6, rtol=0)
    module.calls.clear()
    again = module.zero_shot_classifier(NAMES, TEMPLATES)
    assert module.calls == [] and again is first  # unchanged weights: not re-encoded
    with torch.no_grad():  # an optimizer step on the image tower leaves the prompts alone
        next(module.clip.model.visual.parameters()).add_(0.1)
    assert module.zero_shot_classifier(NAMES, TEMPLATES) is first and module.calls == []
    with torch.no_grad():  # ... one on the text tower does not
        module.clip.model.token_embedding.weight.mul_(1.5).add_(0.01)
    module.calls.clear()
    updated = module.zero_shot_classifier(NAMES, TEMPLATES)
    assert module.calls != []
    assert not torch.allclose(updated, first)
    module.calls.clear()
    torch.testing.assert_close(updated.double(), reference_classifier(module), atol=1e-6, rtol=0)


def test_prompts_encoded_under_the_trainer_autocast(module):
    @contextmanager
    def forward_context():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield

    module._trainer = SimpleNamespace(
        precision_plugin=SimpleNamespace(forward_context=forward_context)
    )
    classifier = module.zero_shot_classifier(NAMES, TEMPLATES)
    assert module.calls and all(module.calls)  # autocast on while encoding
    assert classifier.dtype == torch.float32
    norms = classifier.norm(dim=1)
    torch.testing.assert_close(norms, torch.ones_like(norms))
    module._trainer = None
