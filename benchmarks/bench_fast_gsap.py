"""Timing of the fast smoothed-AP kernel against an InfoNCE step (``python -m benchmarks.bench_fast_gsap``).

One step = similarity matmul of a square batch (B × d embeddings, 4 samples per
class) + loss forward + backward to the embeddings. Reported as ratios to the
InfoNCE step (``F.cross_entropy(emb @ emb.T / τ, arange(B))``) measured in the
same process, best of ``--repeats``. With ``--memory`` every configuration
runs in a fresh subprocess and reports its peak resident-set growth (Linux CPU).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from rl_gap.losses.fast_sap.kernel import smoothed_ap_fast
from rl_gap.losses.smoothed_ap import smoothed_ap_exact


def make_batch(batch: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit-norm random embeddings (B, dim) and labels with 4 samples per class."""
    gen = torch.Generator().manual_seed(seed)
    emb = F.normalize(torch.randn(batch, dim, generator=gen), dim=1)
    return emb, torch.arange(batch) // 4


def step(kind: str, emb: torch.Tensor, labels: torch.Tensor, tau: float) -> None:
    """One forward + backward of ``kind`` in {infonce, fast, fast_flat, exact}."""
    emb = emb.detach().requires_grad_()
    sim = emb @ emb.T
    if kind == "infonce":
        loss = F.cross_entropy(sim / tau, torch.arange(emb.shape[0]))
    elif kind == "fast_flat":  # the whole matrix as a flat view + valid mask: no sim[valid] copy
        valid = ~torch.eye(emb.shape[0], dtype=torch.bool)
        relevant = labels[:, None] == labels[None, :]
        flat = sim.reshape(-1)
        loss = 1.0 - smoothed_ap_fast(flat, relevant.reshape(-1), tau, valid=valid.reshape(-1))
    else:
        valid = ~torch.eye(emb.shape[0], dtype=torch.bool)
        scores = sim[valid]
        positive = (labels[:, None] == labels[None, :])[valid]
        if kind == "fast":
            loss = 1.0 - smoothed_ap_fast(scores, positive, tau)
        else:
            loss = 1.0 - smoothed_ap_exact(scores, positive, tau)
    loss.backward()


def best_time(kind: str, emb, labels, tau: float, repeats: int) -> float:
    step(kind, emb, labels, tau)  # warm-up (plans, caches)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step(kind, emb, labels, tau)
        times.append(time.perf_counter() - start)
    return min(times)


def peak_rss_mib(kind: str, batch: int, dim: int, tau: float) -> float:
    """Peak RSS growth (MiB) of one step in a fresh interpreter (Linux: VmHWM reset via clear_refs)."""
    code = (
        "import torch\n"
        "from benchmarks.bench_fast_gsap import make_batch, step\n"
        f"torch.set_num_threads({torch.get_num_threads()})\n"
        f"emb, lab = make_batch({batch}, {dim})\n"
        f"step('{kind}', emb[:8], lab[:8], {tau})\n"
        "def status(key):\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith(key):\n"
        "            return int(line.split()[1])\n"
        "open('/proc/self/clear_refs', 'w').write('5')\n"
        "base = status('VmRSS')\n"
        f"step('{kind}', emb, lab, {tau})\n"
        "print((status('VmHWM') - base) / 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default="512,1024,2048")
    parser.add_argument("--taus", default="1e-1,1e-2,1e-3,1e-4")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave)")
    parser.add_argument("--exact", action="store_true", help="also time the exact sweep")
    parser.add_argument("--memory", action="store_true", help="peak RSS per config (slow)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        emb, labels = make_batch(batch, args.dim)
        for tau in (float(t) for t in args.taus.split(",")):
            base = best_time("infonce", emb, labels, tau, args.repeats)
            row = {"B": batch, "tau": tau, "infonce_s": round(base, 4)}
            row["fast_x"] = round(best_time("fast", emb, labels, tau, args.repeats) / base, 2)
            flat = best_time("fast_flat", emb, labels, tau, args.repeats)
            row["fast_flat_x"] = round(flat / base, 2)
            if args.exact:
                row["exact_x"] = round(best_time("exact", emb, labels, tau, 1) / base, 2)
            if args.memory:
                mem_ref = peak_rss_mib("infonce", batch, args.dim, tau)
                row["infonce_MiB"] = round(mem_ref, 1)
                row["fast_MiB"] = round(peak_rss_mib("fast", batch, args.dim, tau), 1)
                row["fast_flat_MiB"] = round(peak_rss_mib("fast_flat", batch, args.dim, tau), 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
