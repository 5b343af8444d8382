"""CLIPFineTuneModule's own optimizer defaults, in Python and in ``rl-gap fit --print_config``."""

from __future__ import annotations

import warnings

import pytest

from rl_gap.models.clip import tiny_clip_config
from rl_gap.modules import CLIPFineTuneModule
from rl_gap.optim import OptimizerSettings
from tests.modules.module_defaults import printed_init_args

# CLIP fine-tuning's settings (gSAP paper §C.1): AdamW, lr 1e-5, weight decay 0.1, β2 0.98
CLIP_DEFAULTS = dict(optimizer="adamw", lr=1e-5, weight_decay=0.1, betas=(0.9, 0.98))


@pytest.fixture(scope="module")
def tiny():
    return dict(
        model_name=None, model_config=tiny_clip_config(width=32, layers=1, context_length=16)
    )


def _module(tiny, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return CLIPFineTuneModule(**tiny, **kwargs)


def test_clip_defaults_and_old_keyword_calls(tiny):
    assert _module(tiny).optimizer_settings == OptimizerSettings(**CLIP_DEFAULTS)
    module = _module(tiny, optimizer="sgd", lr=0.1, momentum=0.5, warmup=10)
    assert module.optimizer_settings == OptimizerSettings(
        optimizer="sgd", lr=0.1, weight_decay=0.1, betas=(0.9, 0.98), momentum=0.5, warmup=10
    )


def test_clip_defaults_show_in_print_config():
    shown = printed_init_args("rl_gap.modules.CLIPFineTuneModule")
    assert (shown["optimizer"], shown["lr"], shown["weight_decay"]) == ("adamw", 1e-5, 0.1)
    assert shown["betas"] == [0.9, 0.98] and shown["momentum"] == 0.9
    assert shown["scheduler"] == "cosine" and shown["shard_loss"] == "auto"
