"""2-process DDP: one CLIP step on 2 × 4 pairs equals one process stepping on all 8."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from rl_gap.data.image_text import PairCollate
from rl_gap.models.clip import tiny_clip_config
from rl_gap.modules.clip_finetune import CLIPFineTuneModule

CAPTIONS = [
    "LATIN SMALL LETTER A",
    "DIGIT ONE",
    "GREEK SMALL LETTER ALPHA",
    "LATIN CAPITAL LETTER E WITH CARON",
    "LATIN SMALL LETTER A",  # same caption group as sample 0
    "DIGIT TWO",
    "GREEK CAPITAL LETTER OMEGA",
    "LATIN CAPITAL LETTER E WITH CARON",  # same group as sample 3
]
GROUPS = [0, 1, 2, 3, 0, 5, 6, 3]
LR = 0.5


class Pairs(Dataset):
    def __init__(self, images: torch.Tensor) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(CAPTIONS)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.images[i], "text": CAPTIONS[i], "group": GROUPS[i]}


def make_module() -> CLIPFineTuneModule:
    torch.manual_seed(0)
    return CLIPFineTuneModule(
        model_name=None,
        model_config=tiny_clip_config(width=32, layers=1, context_length=16),
        loss={"name": "gsap", "temperature": 0.1},
        optimizer="sgd",
        lr=LR,
        momentum=0.0,
        weight_decay=0.0,
        scheduler="none",
    )


@pytest.mark.ddp
def test_two_process_step_equals_one_process_on_the_global_batch():
    images = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    module = make_module()
    initial = copy.deepcopy(module.state_dict())

    # Reference: one process, the whole batch of 8, plain SGD by hand.
    reference = make_module()
    reference.load_state_dict(initial)
    batch = PairCollate()([Pairs(images)[i] for i in range(8)])
    sim, rel, valid = reference.global_similarity(batch)
    assert int(rel.sum()) == 12  # 8 diagonal + 2 repeated caption groups × 2
    reference.loss_fn(sim, rel, valid).backward()
    expected = {}
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if p.requires_grad:
                assert p.grad is not None, name
                expected[name] = p - LR * p.grad

    loader = DataLoader(Pairs(images), batch_size=4, shuffle=False, collate_fn=PairCollate())
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=loader)  # rank 0's weights come back here

    params = dict(module.named_parameters())
    moved = 0
    for name, want in expected.items():
        got = params[name].detach()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=name)
        moved += int(not torch.equal(want, initial[name]))
    assert moved > 10  # the step changed most tensors: the comparison is not vacuous
