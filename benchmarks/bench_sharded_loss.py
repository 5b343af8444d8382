"""Per-rank cost of the loss step, sharded vs replicated, at a fixed global batch.

W gloo processes (``torch.multiprocessing.spawn``, one thread each: one rank
= one device) hold B/W unit embeddings each (d = 128, 4 per class). The
timed *loss step* is what a module's training step does after the encoder:

- replicated (``shard_loss: false``): all-gather the embeddings with
  gradients, ``sim = Z Zᵀ`` (B × B) on every rank, the loss on the whole
  matrix, backward to the local embeddings;
- sharded (``shard_loss: true``): the same gather, ``sim = z_local Zᵀ``
  ((B/W) × B), ``loss_fn(..., sharded=True)``, backward.

Figures per rank (the table shows the largest over ranks):
- ``time``: median over ``--reps`` steps after one warmup step, seconds;
- ``peak``: peak extra resident memory of one step after the warmup step
  (the largest over the timed steps): the kernel's peak-RSS
  counter (VmHWM) is reset via ``/proc/self/clear_refs`` right before the
  step and read after it, minus the RSS before (glibc's mmap threshold is
  pinned at 64 KiB through ``MALLOC_MMAP_THRESHOLD_`` so that every large
  tensor is mapped and unmapped, and each step's RSS shows its own peak);
- ``sent``: bytes this rank contributed to the loss's collectives, counted
  in ``rl_gap.dist`` (a ring all-reduce puts at most twice that
  on the wire), and separately the embedding gather (B/W × d × 4 bytes
  forward, the B × d × 4-byte gradient all-reduce backward).

``--collective-times`` also prints, for W > 1, every collective of one step on
rank 0 in order (median over the timed steps): where the per-step time that does
not shrink with W goes.

With W = 4 on a machine with fewer than 4 cores the processes share cores:
per-rank times then include waiting for a core (the script says so).

Example (the table in docs/distributed.md):
    python benchmarks/bench_sharded_loss.py --batch-sizes 2048 4096 --worlds 1 2 4 \\
        --neg-drop 0 0.9 --reps 3
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

DIM = 128


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _measured(step):
    """Run ``step()``; return (seconds, peak extra RSS in bytes)."""
    import gc

    gc.collect()
    base = _rss_kib("VmRSS:")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM := VmRSS
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    return seconds, (_rss_kib("VmHWM:") - base) * 1024


class CollectiveClock:
    """Wall time of every all-reduce / all-gather while ``on`` (module-level patch of
    ``torch.distributed``, which ``rl_gap.dist`` and the sharding comm both call)."""

    def __init__(self, torch_dist) -> None:
        self.on, self.steps = False, []
        for name in ("all_reduce", "all_gather"):
            setattr(torch_dist, name, self._timed(getattr(torch_dist, name), name))

    def _timed(self, fn, name):
        def timed(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self.steps[-1].append((name, time.perf_counter() - start))
            return out

        return timed

    def start_step(self) -> None:
        self.steps.append([])

    def medians(self) -> list[tuple[str, float]]:
        """Per position in the step: the collective and its median seconds over the steps."""
        return [
            (calls[0][0], statistics.median(seconds for _, seconds in calls))
            for calls in zip(*self.steps)
        ]


def _loss_step(path, loss_fn, emb, labels, local_labels, start, batch):
    """One loss step from this rank's embeddings ``emb`` (see the module docstring)."""
    import torch

    from rl_gap import dist

    emb.grad = None
    gathered = dist.gather_with_grad(emb)
    if path == "replicated":
        sim = gathered @ gathered.T
        rel = labels[:, None] == labels[None, :]
        valid = ~torch.eye(batch, dtype=torch.bool)
        loss = loss_fn(sim, rel, valid)
    else:
        sim = emb @ gathered.T
        rel = local_labels[:, None] == labels[None, :]
        valid = torch.ones_like(rel)
        own = torch.arange(emb.shape[0])
        valid[own, own + start] = False
        loss = loss_fn(sim, rel, valid, sharded=True)
    loss.backward()
    return loss


def _worker(rank: int, world: int, init_file: str, out_dir: str, args: dict) -> None:
    import torch
    import torch.distributed as torch_dist
    import torch.nn.functional as F

    from rl_gap import dist as shard_comm
    from rl_gap.losses import build_loss

    torch.set_num_threads(1)
    clock = CollectiveClock(torch_dist) if args["collective_times"] else None
    torch_dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
    )
    results = []
    try:
        batch = args["batch"]
        sizes = [batch // world + (r < batch % world) for r in range(world)]
        start = sum(sizes[:rank])
        gen = torch.Generator().manual_seed(0)
        all_emb = F.normalize(torch.randn(batch, DIM, generator=gen), dim=1)
        labels = torch.arange(batch) // 4
        local_labels = labels[start : start + sizes[rank]]
        for loss_name, kwargs in args["losses"]:
            loss_fn = build_loss(loss_name, **kwargs)
            for path in ("replicated", "sharded"):
                emb = all_emb[start : start + sizes[rank]].clone().requires_grad_(True)

                step = functools.partial(
                    _loss_step, path, loss_fn, emb, labels, local_labels, start, batch
                )
                times, peaks = [], []
                if clock is not None:
                    clock.steps = []
                with shard_comm.counting() as counter:
                    for rep in range(args["reps"] + 1):
                        torch_dist.barrier()
                        if clock is not None and rep > 0:
                            clock.on = True
                            clock.start_step()
                        seconds, peak = _measured(step)
                        if clock is not None:
                            clock.on = False
                        if rep == 0:  # the warmup: one-time caches (grid plans, FFT tables)
                            sent, calls = counter.bytes_sent, counter.calls
                        else:
                            times.append(seconds)
                            peaks.append(peak)
                gather_bytes = sizes[rank] * DIM * 4 + batch * DIM * 4 if world > 1 else 0
                results.append(
                    dict(
                        loss=loss_name,
                        kwargs=kwargs,
                        path=path,
                        rank=rank,
                        rows=sizes[rank],
                        time=statistics.median(times),
                        peak=max(peaks),
                        sent=sent if path == "sharded" else 0,
                        calls=calls if path == "sharded" else 0,
                        gather=gather_bytes,
                        collectives=clock.medians() if clock is not None else None,
                    )
                )
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        torch_dist.barrier()
    finally:
        torch_dist.destroy_process_group()


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--losses", nargs="+", default=["gsap"])
    parser.add_argument("--temperature", type=float, default=0.01)
    parser.add_argument("--neg-drop", type=float, nargs="+", default=[0.0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--collective-times",
        action="store_true",
        help="also time every collective of the step (rank 0, median over the steps, in order)",
    )
    opts = parser.parse_args()

    import torch
    import torch.multiprocessing as mp

    # Pin glibc's mmap threshold (inherited by the spawned ranks): large tensors are then
    # always mapped and unmapped, so each step's RSS peak is its own.
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    cores = os.cpu_count() or 1
    losses = []
    for name in opts.losses:
        if name == "gsap":
            for alpha in opts.neg_drop:
                losses.append(
                    ("gsap", {"impl": "fast", "temperature": opts.temperature, "neg_drop": alpha})
                )
        elif name == "infonce":
            losses.append(("infonce", {"temperature": opts.temperature}))
        else:
            losses.append((name, {}))
    print(f"torch {torch.__version__}, {cores} CPU core(s), one thread per rank, gloo; no GPU")
    rows = []
    for batch in opts.batch_sizes:
        for world in opts.worlds:
            if world > cores:
                print(
                    f"note: W = {world} > {cores} cores: ranks share cores, so per-rank times "
                    "at this W include waiting for a core (memory and bytes are unaffected)"
                )
            with tempfile.TemporaryDirectory() as tmp:
                args = dict(
                    batch=batch,
                    losses=losses,
                    reps=opts.reps,
                    collective_times=opts.collective_times,
                )
                mp.spawn(_worker, args=(world, f"{tmp}/init", tmp, args), nprocs=world, join=True)
                per_rank = [
                    json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)
                ]
            for i, first in enumerate(per_rank[0]):
                same = [r[i] for r in per_rank]
                rows.append(
                    dict(
                        batch=batch,
                        world=world,
                        loss=first["loss"],
                        kwargs=first["kwargs"],
                        path=first["path"],
                        time=max(r["time"] for r in same),
                        peak=max(r["peak"] for r in same),
                        sent=max(r["sent"] for r in same),
                        calls=first["calls"],
                        gather=max(r["gather"] for r in same),
                        collectives=first["collectives"],
                    )
                )
            sys.stdout.flush()
    header = (
        f"{'B':>5} {'W':>2} {'loss':<22} {'path':<10} {'time s':>7} {'peak':>10} "
        f"{'loss sent':>10} {'colls':>5} {'gather sent':>11} {'x time':>7} {'x peak':>7}"
    )
    print(header)
    for row in rows:
        ref = next(
            r
            for r in rows
            if r["batch"] == row["batch"]
            and r["world"] == row["world"]
            and r["kwargs"] == row["kwargs"]
            and r["loss"] == row["loss"]
            and r["path"] == "replicated"
        )
        label = row["loss"] + "".join(
            f" a={v}" if k == "neg_drop" else "" for k, v in row["kwargs"].items()
        )
        print(
            f"{row['batch']:>5} {row['world']:>2} {label:<22} {row['path']:<10} "
            f"{row['time']:>7.3f} {_fmt_bytes(row['peak']):>10} {_fmt_bytes(row['sent']):>10} "
            f"{row['calls']:>5} {_fmt_bytes(row['gather']):>11} "
            f"{row['time'] / ref['time']:>7.2f} {row['peak'] / max(ref['peak'], 1):>7.2f}"
        )
    print("x time, x peak: sharded / replicated at the same B, W (per rank, worst rank)")
    if opts.collective_times:
        print("\ncollectives of one step on rank 0, in order, median ms (g = all-gather):")
        for row in rows:
            if row["world"] > 1 and row["collectives"]:
                label = f"{row['batch']:>5} {row['world']:>2} {row['path']:<10} " + " ".join(
                    f"{k}={v}" for k, v in row["kwargs"].items() if k == "neg_drop"
                )
                times = " ".join(
                    f"{'g' if name == 'all_gather' else ''}{1e3 * seconds:.2f}"
                    for name, seconds in row["collectives"]
                )
                print(
                    f"{label:<32} {times}  (sum {1e3 * sum(t for _, t in row['collectives']):.1f})"
                )
    if opts.json:
        opts.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
