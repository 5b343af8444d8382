"""One training step under ``DistributedDataParallel`` on 2 gloo processes, per case.

Each process holds its rows of the batch (``split``: ragged shares), runs the module's
training step as the DDP forward (what Lightning's wrapper does) and one backward; the
loss and the parameter gradients after DDP's averaging come back per rank, for the
tests to compare with a one-process reference.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp
from torch import nn


class StepWrapper(nn.Module):
    """What Lightning's DDP wrapper does: the DDP forward is the training step."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch):
        return self.module.training_step(batch, 0)


def grads(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def _worker(rank: int, init_file: str, out_dir: str, build: Callable, batch: Callable,
            split: Sequence[int], cases: list, find_unused: bool) -> None:  # fmt: skip
    torch_dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=len(split)
    )
    warnings.filterwarnings("ignore")
    try:
        rows = slice(sum(split[:rank]), sum(split[: rank + 1]))
        results = []
        for case in cases:
            module = build(case)
            model = nn.parallel.DistributedDataParallel(
                StepWrapper(module), find_unused_parameters=find_unused
            )
            loss = model(batch(case, rows))
            loss.backward()
            results.append((loss.detach(), grads(module)))
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        torch_dist.barrier()
    finally:
        torch_dist.destroy_process_group()


def ddp_step_results(tmp_path: Path, build: Callable[[Any], nn.Module],
                     batch: Callable[[Any, slice], Any], cases: list,
                     split: Sequence[int] = (3, 5),
                     find_unused: bool = False) -> list[list[tuple[torch.Tensor, dict]]]:  # fmt: skip
    """Per rank, per case (in order): ``(loss, {parameter name: gradient})``.

    ``build(case)`` makes the module (a picklable top-level function: each process
    builds its own), ``batch(case, rows)`` that process's rows of the batch.
    """
    args = (str(tmp_path / "init"), str(tmp_path), build, batch, tuple(split), cases, find_unused)
    mp.spawn(_worker, args=args, nprocs=len(split), join=True)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(len(split))]
