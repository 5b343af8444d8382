"""RankingModule: the loss from its recipe section, the optimizer from one OptimizerSettings.

References are hand-written values and torch's own optimizers (their param_groups).
"""

from __future__ import annotations

import functools

import pytest
import torch

from rl_gap.losses import get_loss_class
from rl_gap.losses.registry import LossSectionError
from rl_gap.modules import MetricLearningModule
from rl_gap.optim import OptimizerSettings, OptimizerSettingsError
from tests.modules.module_defaults import printed_init_args

TINY = dict(backbone="rl_gap_convnet", backbone_kwargs={"width": 4}, in_chans=1, dim=8)


def test_old_keyword_calls_build_the_same_optimizer():
    module = MetricLearningModule(
        **TINY, optimizer="sgd", lr=0.1, momentum=0.8, weight_decay=0.01, scheduler="none"
    )
    assert module.optimizer_settings == OptimizerSettings(
        optimizer="sgd", lr=0.1, momentum=0.8, weight_decay=0.01, scheduler="none"
    )
    optimizer = module.configure_optimizers()
    assert type(optimizer) is torch.optim.SGD
    by_decay = {g["weight_decay"]: g for g in optimizer.param_groups}
    assert set(by_decay) == {0.01, 0.0}  # ≥2-D weights decay, biases and norms do not
    assert all(g["lr"] == 0.1 and g["momentum"] == 0.8 for g in optimizer.param_groups)


def test_metric_learning_takes_the_base_defaults():
    module = MetricLearningModule(**TINY)
    assert module.optimizer_settings == OptimizerSettings(
        optimizer="adamw", lr=1e-4, weight_decay=1e-4, betas=(0.9, 0.999), momentum=0.9,
        scheduler="cosine", warmup=0.0, min_lr_ratio=0.0, lr_scales=None,
    )  # fmt: skip
    shown = printed_init_args("rl_gap.modules.MetricLearningModule")
    assert (shown["lr"], shown["weight_decay"], shown["betas"]) == (1e-4, 1e-4, [0.9, 0.999])


def test_settings_are_checked_once_when_the_module_is_made(monkeypatch):
    checks = []
    original = OptimizerSettings.__post_init__

    def counted(self):
        checks.append(self.lr)
        original(self)

    monkeypatch.setattr(OptimizerSettings, "__post_init__", counted)
    MetricLearningModule(**TINY, lr=3e-4)
    assert checks == [3e-4]
    with pytest.raises(OptimizerSettingsError, match=r"^lr must be a finite number > 0, got -1"):
        MetricLearningModule(**TINY, lr=-1)


def test_loss_from_the_section_built_once(monkeypatch):
    cls = get_loss_class("msap")
    original = cls.__init__
    built = []

    @functools.wraps(original)
    def counted(self, *args, **kwargs):
        built.append(kwargs)
        original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", counted)
    section = {"name": "msap", "gsap": {"neg_drop": 0.9}, "msap": {"temperature": 0.02}}
    module = MetricLearningModule(**TINY, loss=section)
    assert built == [{"temperature": 0.02}]
    assert module.loss_config == section


def test_no_loss_section_is_gsap_and_a_bad_value_names_its_key():
    module = MetricLearningModule(**TINY)
    assert type(module.loss_fn) is get_loss_class("gsap")
    with pytest.raises(LossSectionError, match=r"^temperature must be a finite number > 0"):
        MetricLearningModule(**TINY, loss={"name": "gsap", "temperature": -1.0})
