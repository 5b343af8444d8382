"""Run one function on W gloo ranks (spawned processes) and collect what each rank returns.

``on_ranks(tmp_path, world, fn, *args)`` spawns ``world`` processes, each joins a gloo
group (file rendezvous under ``tmp_path``), calls ``fn(rank, world, *args)`` and saves
its return value; the list of the ranks' values comes back in rank order. ``fn`` must
be a module-level function (the workers import it by name).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp


def _worker(rank: int, world: int, init_file: str, out_dir: str, fn: Callable, args: tuple):
    torch_dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
    )
    try:
        result = fn(rank, world, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        torch_dist.barrier()
    finally:
        torch_dist.destroy_process_group()


def on_ranks(tmp_path: Path, world: int, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """``[fn(rank, world, *args) for rank in range(world)]``, each run on its own gloo rank."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), str(tmp_path), fn, args), nprocs=world)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]


def row_block(rank: int, split: list[int]) -> slice:
    """The rows of the global matrix rank ``rank`` holds when ranks hold ``split`` rows each."""
    return slice(sum(split[:rank]), sum(split[: rank + 1]))
