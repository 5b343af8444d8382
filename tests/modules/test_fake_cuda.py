"""The modules' training and validation steps on a (fake) CUDA device equal the CPU run."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from rl_gap.metrics.functional import evaluate_embeddings
from rl_gap.models.clip import tiny_clip_config
from rl_gap.modules import MetricLearningModule
from rl_gap.modules.clip_finetune import CLIPFineTuneModule
from rl_gap.modules.moco_v3 import MoCoV3Module

TINY_ML = dict(backbone="rl_gap_convnet", backbone_kwargs={"width": 4}, in_chans=1, dim=8)
TINY_MOCO = dict(
    backbone="vit_tiny_patch16_224",
    backbone_kwargs=dict(img_size=8, patch_size=4, in_chans=1, depth=1, embed_dim=16, num_heads=2),
    hidden_dim=32,
    embed_dim=8,
    loss={"name": "gsap", "temperature": 0.05, "impl": "fast", "neg_drop": 0.5},
    retrieval_max_queries=0,
)


def on(device, batch):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: on(device, v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(on(device, v) for v in batch)
    return batch


def train_and_validate(module, device, train_batch, val_steps):
    """One training step's loss and gradients, then the validation steps' outputs."""
    module = copy.deepcopy(module).to(device)
    module.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log without a trainer
        loss = module.training_step(on(device, train_batch), 0)
        loss.backward()
        grads = {n: p.grad.cpu() for n, p in module.named_parameters() if p.grad is not None}
        module.eval()
        with torch.no_grad():
            outputs = [step(module, on(device, batch)) for step, batch in val_steps]
    return loss.detach().cpu(), grads, outputs


def assert_same_run(cpu, dev):
    torch.testing.assert_close(dev[0], cpu[0], rtol=1e-5, atol=1e-6)
    assert dev[1].keys() == cpu[1].keys() and len(cpu[1]) > 0
    for name in cpu[1]:
        torch.testing.assert_close(dev[1][name], cpu[1][name], rtol=1e-4, atol=1e-6, msg=name)


def test_metric_learning_steps_on_cuda(fake_cuda):
    torch.manual_seed(0)
    module = MetricLearningModule(**TINY_ML, loss={"name": "gsap", "temperature": 0.05})
    g = torch.Generator().manual_seed(1)
    images, labels = torch.randn(12, 1, 16, 16, generator=g), torch.arange(12) // 3
    batch = (images, labels, torch.arange(12))

    def embed(m, b):
        out = m.validation_step(b, 0)
        assert out["embeddings"].device.type == b[0].device.type
        return evaluate_embeddings(
            out["embeddings"], out["embeddings"], out["labels"], out["labels"], exclude_self=True
        )

    cpu = train_and_validate(module, "cpu", batch, [(embed, batch)])
    dev = train_and_validate(module, fake_cuda.device, batch, [(embed, batch)])
    assert_same_run(cpu, dev)
    assert dev[2][0] == pytest.approx(cpu[2][0], abs=1e-6, nan_ok=True)


def test_moco_steps_on_cuda(fake_cuda):
    torch.manual_seed(0)
    module = MoCoV3Module(**TINY_MOCO)
    g = torch.Generator().manual_seed(2)
    x1 = torch.randn(8, 1, 8, 8, generator=g)
    train = {
        "views": [x1, x1 + 0.3 * torch.randn(8, 1, 8, 8, generator=g)],
        "label": torch.arange(8),
    }
    bank = {"image": torch.randn(10, 1, 8, 8, generator=g), "label": torch.arange(10) % 3,
            "index": torch.arange(10)}  # fmt: skip
    query = {"image": torch.randn(6, 1, 8, 8, generator=g), "label": torch.arange(6) % 3,
             "index": torch.arange(6)}  # fmt: skip

    def bank_step(m, b):
        m.knn.reset()
        m.validation_step(b, 0, dataloader_idx=0)

    def query_step(m, b):
        m.validation_step(b, 0, dataloader_idx=1)
        return {k: float(v) for k, v in m.knn.compute().items()}

    steps = [(bank_step, bank), (query_step, query)]
    cpu = train_and_validate(module, "cpu", train, steps)
    dev = train_and_validate(module, fake_cuda.device, train, steps)
    assert_same_run(cpu, dev)
    assert dev[2][1] == pytest.approx(cpu[2][1])


def test_clip_steps_on_cuda(fake_cuda):
    torch.manual_seed(0)
    module = CLIPFineTuneModule(
        model_name=None,
        model_config=tiny_clip_config(width=32, context_length=16),
        loss={"name": "gsap", "temperature": 0.05, "impl": "fast"},
    )
    g = torch.Generator().manual_seed(3)
    names = ["red", "green", "blue", "cyan"]
    batch = {"image": torch.randn(4, 3, 32, 32, generator=g), "text": [f"a {n}" for n in names],
             "group": torch.arange(4)}  # fmt: skip

    def zero_shot(m, b):
        from rl_gap.metrics.zero_shot import zero_shot_accuracy
        from rl_gap.precision import full_precision_similarity

        emb = m.encode_image(b["image"])
        classifier = m.zero_shot_classifier(names, ["{}", "a photo of {}"])
        assert classifier.device.type == emb.device.type
        return zero_shot_accuracy(full_precision_similarity(emb, classifier), b["group"])

    cpu = train_and_validate(module, "cpu", batch, [(zero_shot, batch)])
    dev = train_and_validate(module, fake_cuda.device, batch, [(zero_shot, batch)])
    assert_same_run(cpu, dev)
    assert dev[2][0] == pytest.approx(cpu[2][0])
