"""GPU benchmark: fast gSAP against InfoNCE, and the metric engine against the bare GEMM.

    python benchmarks/bench_gpu.py                       # B = 4096, 16384; α = 0, 0.9, 0.95
    python benchmarks/bench_gpu.py --batches 4096 --engine-size 20000 --json out.json

Loss steps run as a ``bf16-mixed`` trainer runs them: a linear head under bf16 autocast makes
the (B, d) embeddings, the module forms the float32 similarity matrix
(``full_precision_similarity``), the loss ranks it, and backward reaches the head. Labels give
4 samples per class. Each configuration is timed with CUDA events (median of ``--repeats``
after one warm-up step) and its peak allocated memory is read from
``torch.cuda.max_memory_allocated``. Ratios are to the InfoNCE step at the same B.

The engine row evaluates a leave-one-out set of SOP's size (60k x 60k, d = 512) with
``evaluate_embeddings(..., device="cuda")`` and compares it with computing the same 60k x 60k
float32 scores block by block (the bare GEMM, IEEE float32).

Exit status: 0 measured; 2 no CUDA device (``torch.cuda.is_available()`` is False: nothing
is measured and a message says so); 1 any other error. ``--device cpu`` runs the same code
on the CPU (for checking the script with small sizes; no memory figures).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from rl_gap.losses import build_loss
from rl_gap.metrics.functional import evaluate_embeddings
from rl_gap.precision import full_precision_similarity, ieee_float32

NO_CUDA_EXIT = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.9, 0.95])
    parser.add_argument("--temperature", type=float, default=0.01, help="gSAP τ")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--engine-size", type=int, default=60_000, help="0 skips the engine")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--json", help="also write the rows to this file")
    return parser.parse_args(argv)


class Timer:
    """Median wall time of a callable on ``device`` (CUDA events there), with peak memory."""

    def __init__(self, device: torch.device, repeats: int) -> None:
        self.device, self.repeats = device, repeats

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, fn: Callable[[], None]) -> tuple[float, float | None]:
        fn()  # warm-up: plans, caches, cuBLAS handles
        self.sync()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        times = []
        for _ in range(self.repeats):
            self.sync()
            start = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - start)
        peak = None
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) / 2**30
        return statistics.median(times), peak


def loss_step(loss_fn, head, features, rel, valid, device) -> Callable[[], None]:
    """One bf16-mixed training step of a loss on a (B, d) batch, to the head's gradient."""

    def run() -> None:
        head.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            emb = F.normalize(head(features), dim=1)
            sim = full_precision_similarity(emb)
            loss = loss_fn(sim, rel, valid)
        loss.backward()

    return run


def bench_losses(args: argparse.Namespace, device: torch.device, timer: Timer) -> list[dict]:
    rows = []
    for batch in args.batches:
        gen = torch.Generator().manual_seed(batch)
        features = torch.randn(batch, args.dim, generator=gen).to(device)
        head = torch.nn.Linear(args.dim, args.dim).to(device)
        labels = torch.arange(batch, device=device) // 4
        valid = ~torch.eye(batch, dtype=torch.bool, device=device)
        rel = (labels[:, None] == labels[None, :]) & valid
        infonce = build_loss("infonce", temperature=0.05).to(device)
        base, base_mem = timer(loss_step(infonce, head, features, rel, valid, device))
        rows.append(row("infonce", batch, None, base, base_mem, base, base_mem))
        for alpha in args.alphas:
            gsap = build_loss("gsap", temperature=args.temperature, neg_drop=alpha, impl="fast")
            seconds, mem = timer(loss_step(gsap, head, features, rel, valid, device))
            rows.append(row("gsap fast", batch, alpha, seconds, mem, base, base_mem))
        del features, head, labels, valid, rel
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def bench_engine(args: argparse.Namespace, device: torch.device, timer: Timer) -> list[dict]:
    n, d = args.engine_size, args.dim
    gen = torch.Generator().manual_seed(0)
    # SOP-like: ~5 images per class; unit vectors near their class centre.
    labels = torch.arange(n) // 5
    centres = F.normalize(torch.randn(int(labels[-1]) + 1, d, generator=gen), dim=1)
    emb = F.normalize(centres[labels] + 0.8 * torch.randn(n, d, generator=gen) / d**0.5, dim=1)
    emb, labels = emb.to(device), labels.to(device)
    block = 8192

    def bare_gemm() -> None:
        with ieee_float32():
            for start in range(0, n, block):
                emb[start : start + block] @ emb.T

    def engine() -> None:
        evaluate_embeddings(emb, emb, labels, labels, exclude_self=True, device=device)

    gemm, gemm_mem = timer(bare_gemm)
    seconds, mem = timer(engine)
    return [
        row(f"bare GEMM {n}x{n}", None, None, gemm, gemm_mem, gemm, gemm_mem),
        row(f"engine {n}x{n}", None, None, seconds, mem, gemm, gemm_mem),
    ]


def row(name, batch, alpha, seconds, mem, base, base_mem) -> dict:
    return {
        "name": name,
        "batch": batch,
        "alpha": alpha,
        "ms": 1e3 * seconds,
        "time_ratio": seconds / base,
        "peak_gib": mem,
        "memory_ratio": None if mem is None or not base_mem else mem / base_mem,
    }


def print_table(rows: list[dict]) -> None:
    header = f"{'step':<22} {'B':>6} {'α':>5} {'ms':>10} {'x base':>7} {'peak GiB':>9} {'x mem':>6}"
    print(header)
    print("-" * len(header))
    for r in rows:
        batch = "" if r["batch"] is None else r["batch"]
        alpha = "" if r["alpha"] is None else f"{r['alpha']:.2f}"
        peak = "n/a" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        mem = "n/a" if r["memory_ratio"] is None else f"{r['memory_ratio']:.2f}"
        print(
            f"{r['name']:<22} {batch:>6} {alpha:>5} {r['ms']:>10.2f} "
            f"{r['time_ratio']:>7.2f} {peak:>9} {mem:>6}"
        )
    print("x base: time over the InfoNCE step at the same B (engine: over the bare GEMM)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "bench_gpu.py needs a CUDA device, and torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); nothing was "
            "measured. Run it on a GPU machine (or pass --device cpu to check the script).",
            file=sys.stderr,
        )
        return NO_CUDA_EXIT
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    timer = Timer(device, max(1, args.repeats))
    rows = bench_losses(args, device, timer)
    if args.engine_size > 0:
        rows += bench_engine(args, device, timer)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
