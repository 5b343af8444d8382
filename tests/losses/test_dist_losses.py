"""Every registered loss gives the same gradients on 2 ranks as on 1 process.

Two gloo processes (one ``torch.multiprocessing.spawn``) each encode half of
a batch (unequal halves, 7 + 9, to cover ragged batches) with the same
float64 Linear encoder, all-gather the embeddings with gradients
(``rl_gap.dist``), compute the loss on the global matrix, and average
parameter gradients over ranks exactly as DDP does. That must equal one
process holding the whole batch, for the encoder and the loss's own
parameters, within 1e-6.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from rl_gap import dist
from rl_gap.losses import available_losses, build_loss

WORLD = 2
SPLIT = [7, 9]
# Non-default settings that take other code paths (negative dropping, symmetry,
# learnable scale); every registered loss also runs with its defaults.
VARIANTS = {
    "gsap/drop": ("gsap", {"temperature": 0.05, "neg_drop": 0.5, "chunk_size": 5}),
    "msap/sym": ("msap", {"temperature": 0.05, "neg_drop": 0.3, "symmetric": True}),
    "infonce/learn": ("infonce", {"learnable_scale": True, "symmetric": True}),
}


def all_configs() -> dict[str, tuple[str, dict]]:
    configs = {name: (name, {}) for name in available_losses()}
    configs.update(VARIANTS)
    return configs


def make_data():
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(sum(SPLIT), 5, generator=gen, dtype=torch.float64)
    labels = torch.arange(sum(SPLIT)) % 4
    return inputs, labels


def make_encoder() -> torch.nn.Linear:
    torch.manual_seed(1)
    return torch.nn.Linear(5, 3).double()


def loss_and_grads(loss_name, kwargs, inputs, labels):
    """Encode, gather to the global batch, return (loss, {param name: grad})."""
    encoder = make_encoder()
    loss_fn = build_loss(loss_name, **kwargs).double()
    emb = dist.gather_with_grad(F.normalize(encoder(inputs), dim=1))
    all_labels = dist.gather_no_grad(labels)
    sim = emb @ emb.T
    rel = all_labels.unsqueeze(1) == all_labels.unsqueeze(0)
    valid = ~torch.eye(len(all_labels), dtype=torch.bool)
    loss = loss_fn(sim, rel, valid)
    loss.backward()
    grads = {f"encoder.{n}": p.grad.clone() for n, p in encoder.named_parameters()}
    grads.update({f"loss.{n}": p.grad.clone() for n, p in loss_fn.named_parameters()})
    return loss.detach(), grads


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch_dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD
    )
    try:
        inputs, labels = make_data()
        start = sum(SPLIT[:rank])
        local = slice(start, start + SPLIT[rank])
        results = {}
        for key, (name, kwargs) in all_configs().items():
            loss, grads = loss_and_grads(name, kwargs, inputs[local], labels[local])
            for grad in grads.values():  # what DDP does: average over ranks
                torch_dist.all_reduce(grad)
                grad /= WORLD
            results[key] = (loss, grads)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        torch_dist.barrier()  # tear down together (a lone teardown can abort gloo)
    finally:
        torch_dist.destroy_process_group()


@pytest.mark.ddp
def test_two_ranks_match_one_process_for_every_loss(tmp_path: Path):
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    inputs, labels = make_data()
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    assert set(per_rank[0]) == set(all_configs()) and set(available_losses()) <= set(per_rank[0])
    for key, (name, kwargs) in all_configs().items():
        ref_loss, ref_grads = loss_and_grads(name, kwargs, inputs, labels)
        for rank_results in per_rank:
            loss, grads = rank_results[key]
            torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-10, msg=key)
            assert set(grads) == set(ref_grads), key
            for pname, grad in grads.items():
                assert ref_grads[pname].abs().max() > 0, (key, pname)
                torch.testing.assert_close(
                    grad, ref_grads[pname], rtol=0, atol=1e-6, msg=f"{key} {pname}"
                )
