"""Step time and peak memory of ``micro_batch_size`` (gradient caching) against the full batch.

A small LayerNorm ViT (``MetricLearningModule``, gSAP loss) trains at a fixed global batch
B with micro-batches of M = B (the plain one-pass step), B/2, B/4, B/8. Each setting runs
in its own subprocess (a fresh allocator, so peaks do not carry over), which reports:

- step time: the median of ``--repeat`` training steps (forward, loss, backward, AdamW),
  wall time on CUDA, CPU time of the process on CPU (all threads; robust to other jobs);
- peak memory: on CUDA ``torch.cuda.max_memory_allocated``; on CPU the process's peak RSS
  (VmHWM, reset before the first step) minus its RSS then (model and interpreter), so the
  figure is what the steps add: activations, plus the AdamW state (2 x parameters).

Printed as a table and as ratios to the full-batch step. Expectation: the step's memory
falls roughly as M/B (activations of one micro-batch alive at a time; the embeddings and
the loss stay global) and the time rises by about one extra forward pass (~1.3x).

    python benchmarks/bench_micro_batch.py                      # CPU, B=64
    python benchmarks/bench_micro_batch.py --device cuda --batch 512 --img 64 --depth 6
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _reset_peak_rss() -> None:
    """Linux: VmHWM (peak RSS) restarts from the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(args: argparse.Namespace) -> dict:
    import torch

    from rl_gap.modules.metric_learning import MetricLearningModule

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    micro = None if args.micro >= args.batch else args.micro
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = MetricLearningModule(
            backbone="vit_tiny_patch16_224", in_chans=3, dim=64, eval_plots=False,
            backbone_kwargs=dict(img_size=args.img, patch_size=4, depth=args.depth,
                                 embed_dim=args.width, num_heads=args.width // 32),
            loss={"name": "gsap", "temperature": 0.01}, micro_batch_size=micro,
        ).to(device)  # fmt: skip
    module.log = lambda *a, **k: None  # no trainer: logging is not what is measured
    module.log_dict = lambda *a, **k: None
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
    images = torch.randn(args.batch, 3, args.img, args.img, device=device)
    labels = torch.randint(0, args.batch // 4, (args.batch,), device=device)
    batch = (images, labels, torch.arange(args.batch))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        module.training_step(batch, 0).backward()  # the loss: on the whole global batch
        optimizer.step()

    cuda = device.type == "cuda"
    clock = time.perf_counter if cuda else time.process_time  # CPU: robust to a shared machine
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:  # before the warm-up step: pages it frees stay in the heap and would hide its peak
        _reset_peak_rss()
        base = _rss_mib()
    step()  # warm-up: optimizer state allocated, kernels chosen
    times = []
    for _ in range(args.repeat):
        start = clock()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(clock() - start)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else _peak_rss_mib()
    return {"micro": args.micro, "time_s": statistics.median(times), "step_mib": peak - base}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=64, help="global batch B")
    parser.add_argument("--img", type=int, default=32)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--width", type=int, default=192)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--micro", type=int, default=0, help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args()
    if args.micro:
        print(json.dumps(child(args)))
        return
    rows = []
    for divisor in (1, 2, 4, 8):
        micro = args.batch // divisor
        cmd = [sys.executable, __file__, *sys.argv[1:], "--micro", str(micro)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    full = rows[0]
    memory = (
        "peak allocated, wall s"
        if args.device.startswith("cuda")
        else "peak RSS - RSS before, CPU s"
    )
    print(f"B={args.batch} img={args.img} depth={args.depth} width={args.width} "
          f"device={args.device} ({memory})")  # fmt: skip
    print(f"{'M':>6} {'step s':>8} {'step MiB':>9} {'time/full':>9} {'mem/full':>9}")
    for row in rows:
        print(
            f"{row['micro']:>6} {row['time_s']:>8.3f} {row['step_mib']:>9.1f} "
            f"{row['time_s'] / full['time_s']:>9.2f} {row['step_mib'] / full['step_mib']:>9.2f}"
        )


if __name__ == "__main__":
    main()
