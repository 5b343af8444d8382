"""A 2-process DDP step with the sharded loss equals one process holding the global batch.

Two gloo processes (``torch.multiprocessing.spawn``) each hold 3 resp. 5 of the
8 samples (ragged), wrap the module in ``DistributedDataParallel`` (whose
forward calls the module's ``training_step``: each rank scores its own rows
against the gathered batch, ``shard_loss=true``) and run one backward; DDP
averages the gradients. They must equal the gradients of the same module
stepping on all 8 samples in the test process (no process group, the plain
loss on the whole matrix) to 1e-9 in float64, for every parameter: so an SGD
step is the same update. Tiny float64 models with LayerNorm only (per-rank
BatchNorm statistics would differ by design).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from rl_gap.losses import available_losses, build_loss
from rl_gap.losses.sharding.call import supports_sharding
from rl_gap.models.clip import tiny_clip_config
from rl_gap.modules.clip_finetune import CLIPFineTuneModule
from rl_gap.modules.metric_learning import MetricLearningModule
from rl_gap.modules.moco_v3 import MoCoV3Module
from tests.modules.ddp_steps import ddp_step_results, grads

SPLIT = [3, 5]
TINY_VIT = dict(img_size=8, patch_size=4, in_chans=1, depth=1, embed_dim=16, num_heads=2)
# Two caption groups with two pairs each (0 and 4, 3 and 7). The captions differ: identical
# captions encoded on different ranks differ in the last bit (the text encoder's GEMMs depend
# on the batch), which breaks their exact tie and moves the rank-based losses (BlackBox,
# SupAP's step) however the loss is computed, replicated or sharded.
CAPTIONS = ["LETTER A", "DIGIT ONE", "ALPHA", "E WITH CARON", "SMALL A", "TWO", "OMEGA", "CARON"]
GROUPS = [0, 1, 2, 3, 0, 5, 6, 3]
MICRO = "micro_batch_size"  # a case key that is a module setting, not a loss keyword
SGD = dict(optimizer="sgd", lr=0.1, weight_decay=0.0, scheduler="none")

# The default suite: each module with a loss that takes the fast gSAP kernel with
# negative dropping, learnable loss parameters (InfoNCE columns), or BlackBox
# (a gradient not linear in the upstream gradient).
DEFAULT_CASES = [
    ("metric", "gsap", {"impl": "fast", "temperature": 0.05, "neg_drop": 0.5}),
    # micro_batch_size (gradient caching, tests/modules/test_micro_batch_ddp.py): the same step
    ("metric", "gsap", {"impl": "fast", "temperature": 0.05, "neg_drop": 0.5, MICRO: 2}),
    ("metric", "gblackbox", {"neg_drop": 0.3}),
    ("clip", "infonce", {"symmetric": True, "learnable_scale": True}),
    ("clip", "siglip", {}),
    ("moco", "infonce", {"learnable_scale": True, "temperature": 0.2}),
]


def all_cases() -> list[tuple[str, str, dict]]:
    cases = []
    for module in ("metric", "clip", "moco"):
        for name in available_losses():
            if supports_sharding(build_loss(name)) is None:
                cases.append((module, name, {}))
    return cases


def make_module(kind: str, loss_name: str, kwargs: dict) -> nn.Module:
    torch.manual_seed(0)
    kwargs = dict(kwargs)
    micro_batch_size = kwargs.pop(MICRO, None)
    loss = {"name": loss_name, **kwargs}
    if kind == "metric":
        module = MetricLearningModule(
            backbone="vit_tiny_patch16_224",
            backbone_kwargs={k: v for k, v in TINY_VIT.items() if k != "in_chans"},
            dim=6, in_chans=1,
            eval_plots=False, loss=loss, shard_loss=True, **SGD,
        )  # fmt: skip
    elif kind == "clip":
        module = CLIPFineTuneModule(
            model_name=None, model_config=tiny_clip_config(width=32, layers=1, context_length=16),
            loss=loss, shard_loss=True, momentum=0.0, **SGD,
        )  # fmt: skip
    else:
        module = MoCoV3Module(
            backbone="vit_tiny_patch16_224", backbone_kwargs=TINY_VIT, hidden_dim=16,
            embed_dim=6, mlp_batchnorm=False, loss=loss, shard_loss=True, **SGD,
        )  # fmt: skip
    module.micro_batch_size = micro_batch_size
    return module.double()


def make_batch(kind: str, rows: slice):
    gen = torch.Generator().manual_seed(1)
    if kind == "metric":
        images = torch.randn(8, 1, 8, 8, generator=gen, dtype=torch.float64)
        labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
        return images[rows], labels[rows], torch.arange(8)[rows]
    if kind == "clip":
        images = torch.randn(8, 3, 32, 32, generator=gen, dtype=torch.float64)
        return {"image": images[rows], "text": CAPTIONS[rows], "group": torch.tensor(GROUPS)[rows]}
    views = torch.randn(2, 8, 1, 8, 8, generator=gen, dtype=torch.float64)
    return {"views": [views[0, rows], views[1, rows]]}


def _sharded_module(case: tuple[str, str, dict]) -> nn.Module:
    module = make_module(*case)
    assert module.shards_loss()
    return module


def _rows(case: tuple[str, str, dict], rows: slice):
    return make_batch(case[0], rows)


def _check(tmp_path: Path, cases: list) -> None:
    per_rank = ddp_step_results(tmp_path, _sharded_module, _rows, cases, SPLIT, find_unused=True)
    warnings.filterwarnings("ignore")
    for i, (kind, name, kwargs) in enumerate(cases):
        reference = make_module(kind, name, kwargs)
        reference.micro_batch_size = None  # the reference is the one-pass step
        assert not reference.shards_loss()  # one process: the plain loss on the whole matrix
        ref_loss = reference.training_step(make_batch(kind, slice(0, 8)), 0)
        ref_loss.backward()
        expected = grads(reference)
        assert len(expected) > 5, (kind, name)
        for r in per_rank:
            loss, got = r[i]
            torch.testing.assert_close(loss, ref_loss.detach(), rtol=0, atol=1e-10)
            assert set(got) == set(expected), (kind, name)
            for pname, want in expected.items():
                torch.testing.assert_close(
                    got[pname], want, rtol=1e-7, atol=1e-9, msg=f"{kind} {name} {pname}"
                )
        loss_params = [n for n in expected if n.startswith("loss_fn.")]
        if "learnable_scale" in kwargs or name == "siglip":
            assert loss_params and all(expected[n].abs() > 0 for n in loss_params), (kind, name)


@pytest.mark.ddp
def test_sharded_ddp_step_equals_one_process(tmp_path: Path):
    _check(tmp_path, DEFAULT_CASES)


@pytest.mark.ddp
@pytest.mark.slow
def test_sharded_ddp_step_equals_one_process_every_loss(tmp_path: Path):
    _check(tmp_path, all_cases())


def test_shard_loss_switch_is_checked():
    with pytest.raises(ValueError, match="shard_loss must be one of"):
        make_module_with(shard_loss="sometimes")
    with pytest.raises(ValueError, match="symmetric=True"):
        make_module_with(shard_loss="true", loss={"name": "msap", "symmetric": True})
    module = make_module_with(shard_loss="auto", loss={"name": "msap", "symmetric": True})
    assert module.shard_loss == "auto" and not module.shards_loss()  # one process


def make_module_with(**kwargs) -> nn.Module:
    return MoCoV3Module(
        backbone="vit_tiny_patch16_224", backbone_kwargs=TINY_VIT, hidden_dim=16, embed_dim=6,
        mlp_batchnorm=False, **kwargs,
    )  # fmt: skip
