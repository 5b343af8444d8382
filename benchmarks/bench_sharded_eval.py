"""Evaluation time per rank, one process vs W gloo processes (sharded engine).

Every rank holds the same evaluation set (as after the callback's gather) and runs
``rl_gap.callbacks.retrieval.evaluation_metrics`` (leave-one-out: gAP, mAP, R@k,
R@P90, F1, the threshold protocol) with its shard of the engine's blocks; the
metrics are checked equal to the one-process run. Per rank: wall seconds and CPU
seconds (the rank's own work, what sharding divides; wall time falls with it only
when W x ``--threads`` cores are free), medians over ``--repeat`` runs.

    .venv/bin/python benchmarks/bench_sharded_eval.py --size 20000 --worlds 1 2
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def problem(size: int, dim: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    classes = size // 8
    labels = torch.randint(0, classes, (size,), generator=g)
    centers = torch.randn(classes, dim, generator=g)
    x = torch.nn.functional.normalize(centers[labels] + 1.5 * torch.randn(size, dim, generator=g))
    return x, labels


def timed_evaluation(args, shard):
    from rl_gap.callbacks.retrieval import evaluation_metrics

    x, labels = problem(args.size, args.dim)
    times, cpu, metrics = [], [], None
    for _ in range(args.repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        metrics, _ = evaluation_metrics(x, labels, None, block_size=args.block, shard=shard)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return (float(np.median(times)), float(np.median(cpu))), metrics


def worker(rank: int, world: int, port: int, args, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from rl_gap.metrics.functional.sharding import process_group_shard

    seconds, metrics = timed_evaluation(args, process_group_shard())
    torch.save({"seconds": seconds, "metrics": metrics}, Path(folder, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--block", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"{args.size} embeddings, d={args.dim}, block {args.block}, {args.threads} thread(s)/rank"
    )
    reference = None
    print(f"{'W':>3} {'wall s / rank':>14} {'CPU s / rank':>13} {'CPU vs W=1':>10}  gap")
    for world in args.worlds:
        if world == 1:
            seconds, metrics = timed_evaluation(args, None)
            per_rank = [seconds]
        else:
            with tempfile.TemporaryDirectory() as folder:
                mp.start_processes(
                    worker, args=(world, free_port(), args, folder), nprocs=world,
                    start_method="spawn",
                )  # fmt: skip
                results = [torch.load(Path(folder, f"rank{r}.pt")) for r in range(world)]
            per_rank = [r["seconds"] for r in results]
            metrics = results[0]["metrics"]
            assert all(r["metrics"] == metrics for r in results)
        wall = max(t[0] for t in per_rank)
        cpu = max(t[1] for t in per_rank)
        if reference is None:
            reference = (cpu, metrics)
        same = all(
            metrics[k] == v or (np.isnan(metrics[k]) and np.isnan(v))
            for k, v in reference[1].items()
        )
        print(
            f"{world:>3} {wall:>14.2f} {cpu:>13.2f} {cpu / reference[0]:>10.2f}  "
            f"{metrics['gap']:.4f} ({'identical' if same else 'DIFFERENT'} metrics; CPU s "
            f"per rank {' '.join(f'{t[1]:.2f}' for t in per_rank)})"
        )


if __name__ == "__main__":
    main()
