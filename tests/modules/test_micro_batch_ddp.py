"""A 2-process DDP step with ``micro_batch_size`` equals one process's full-batch step.

Two gloo processes hold 3 resp. 5 of the 8 samples (ragged), embed them in
micro-batches of 2 through the gradient cache, gather the cached embeddings, rank
the global batch (sharded or replicated), and run one backward through
``DistributedDataParallel`` (whose forward is the training step, as in Lightning).
Every parameter gradient after DDP's averaging must equal the hand-written
full-batch reference of one process holding all 8 samples (float64, 1e-10).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.modules.ddp_steps import ddp_step_results
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


def _micro_batched_module(case: tuple[str, str, bool]) -> nn.Module:
    kind, loss, shard = case
    module = make_module(kind, loss, shard_loss=shard, micro_batch_size=MICRO)
    assert module.shards_loss() == shard
    return module


def _rows(case: tuple[str, str, bool], rows: slice):
    return make_batch(case[0], rows)


def run_cases(tmp_path: Path, cases: list) -> dict:
    """``{case: max relative gradient difference over ranks and parameters}``, asserted ≤ 1e-10."""
    per_rank = ddp_step_results(tmp_path, _micro_batched_module, _rows, cases, SPLIT)
    worst = {}
    for i, case in enumerate(cases):
        kind, loss, _ = case
        reference = make_module(kind, loss)
        want_loss = reference_loss(reference, kind, make_batch(kind, slice(0, N)), None)
        want_loss.backward()
        want = grads(reference)
        assert len(want) > 5
        worst[case] = 0.0
        for got_loss, got in (r[i] for r in per_rank):
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
