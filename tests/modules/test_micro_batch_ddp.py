"""A 2-process DDP step with ``micro_batch_size`` equals one process's full-batch step.

Two gloo processes hold 3 resp. 5 of the 8 samples (ragged), embed them in
micro-batches of 2 through the gradient cache, gather the cached embeddings, rank
the global batch (sharded or replicated), and run one backward through
``DistributedDataParallel`` (whose forward is the training step, as in Lightning).
Every parameter gradient after DDP's averaging must equal the hand-written
full-batch reference of one process holding all 8 samples (float64, 1e-10).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp
from torch import nn

from tests.modules.micro_batch_cases import (
    N,
    grads,
    make_batch,
    make_module,
    max_rel_diff,
    reference_loss,
)

SPLIT = [3, 5]
MICRO = 2
# (module, loss, shard_loss). First: the fast gSAP kernel with negative dropping, sharded.
# Slow: SigLIP's learnable scale and bias sharded, MoCo's learnable InfoNCE scale replicated
# (both towers / both views cached), then every module x loss x sharding.
DEFAULT_CASES = [("metric", "gsap", True)]  # also in test_sharded_step.py, unmarked
SLOW_CASES = [("clip", "siglip", True), ("moco", "infonce", False)]
MORE_CASES = [
    (kind, loss, shard)
    for kind in ("metric", "clip", "moco")
    for loss in ("gsap", "infonce", "siglip")
    for shard in (True, False)
    if (kind, loss, shard) not in DEFAULT_CASES + SLOW_CASES
]


class StepWrapper(nn.Module):
    """What Lightning's DDP wrapper does: the DDP forward is the training step."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch):
        return self.module.training_step(batch, 0)


def _worker(rank: int, init_file: str, out_dir: str, cases: list) -> None:
    torch_dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2
    )
    warnings.filterwarnings("ignore")
    try:
        rows = slice(sum(SPLIT[:rank]), sum(SPLIT[: rank + 1]))
        results = {}
        for kind, loss, shard in cases:
            module = make_module(kind, loss, shard_loss=shard, micro_batch_size=MICRO)
            assert module.shards_loss() == shard
            model = nn.parallel.DistributedDataParallel(StepWrapper(module))
            value = model(make_batch(kind, rows))
            value.backward()
            results[(kind, loss, shard)] = (value.detach(), grads(module))
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        torch_dist.barrier()
    finally:
        torch_dist.destroy_process_group()


def run_cases(tmp_path: Path, cases: list) -> dict:
    """``{case: max relative gradient difference over ranks and parameters}``, asserted ≤ 1e-10."""
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path), cases), nprocs=2, join=True)
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    worst = {}
    for case in cases:
        kind, loss, _ = case
        reference = make_module(kind, loss)
        want_loss = reference_loss(reference, kind, make_batch(kind, slice(0, N)), None)
        want_loss.backward()
        want = grads(reference)
        assert len(want) > 5
        worst[case] = 0.0
        for got_loss, got in (r[case] for r in per_rank):
            torch.testing.assert_close(got_loss, want_loss.detach(), rtol=1e-12, atol=1e-14)
            worst[case] = max(worst[case], max_rel_diff(got, want))
        assert worst[case] <= 1e-10, (case, worst[case])
    return worst


@pytest.mark.ddp
@pytest.mark.slow  # ~35 s of CPU for the spawn; test_sharded_step.py runs this case unmarked
def test_micro_batched_ddp_step_equals_one_process(tmp_path: Path):
    run_cases(tmp_path, DEFAULT_CASES)


@pytest.mark.ddp
@pytest.mark.slow
def test_micro_batched_ddp_step_equals_one_process_clip_and_moco(tmp_path: Path):
    run_cases(tmp_path, SLOW_CASES)


@pytest.mark.ddp
@pytest.mark.slow
def test_micro_batched_ddp_step_equals_one_process_more_losses(tmp_path: Path):
    run_cases(tmp_path, MORE_CASES)
