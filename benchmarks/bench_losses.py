"""Forward+backward time and peak memory of every loss on a metric-learning batch.

Setup per configuration: B embeddings (d = 128, 4 per class, unit norm,
``requires_grad``); the timed region computes ``sim = emb @ emb.T``, the loss
with the diagonal invalid, and ``backward()``. Time is the median of
``--reps`` runs after one warmup run; when the warmup alone exceeds
``--max-seconds`` it is the single measurement (``reps`` column shows 0).

Peak memory of the first full-size run (the warmup), inputs excluded, after
the libraries were initialised on a tiny batch:
- CUDA: ``torch.cuda.max_memory_allocated()`` minus the allocation before
  the run, after ``reset_peak_memory_stats``.
- CPU: every configuration runs in a fresh subprocess; the kernel's peak-RSS
  counter (VmHWM) is reset to the current RSS via ``/proc/self/clear_refs``
  right before the run, and the figure is VmHWM minus that RSS: the largest
  extra resident memory of one forward+backward (falls back to ``ru_maxrss``
  if the reset is unavailable). Measured on the first run because a later
  run may reuse memory the allocator kept, which RSS would not show again.

With ``--paired`` each worker also times InfoNCE at the same τ, alternating
step by step with the loss, and ``x_infonce`` (suffix ``p``) is the median of
those per-step ratios: on a shared machine the load changes between
processes far more than between two consecutive steps of one process.
``best_x`` is the ratio of the two best steps (load only adds time).

Examples:
    python benchmarks/bench_losses.py                                  # B 256..2048
    python benchmarks/bench_losses.py --batch-sizes 512 1024 2048 4096 \\
        --temperatures 1e-4 1e-3 1e-2 1e-1 --losses gsap msap infonce --impls exact fast
    # the other AP surrogates, per-query and global (docs/losses.md):
    python benchmarks/bench_losses.py --batch-sizes 1024 2048 --losses infonce softbin \
        gsoftbin blackbox gblackbox supap gsupap
    # fast gSAP with negative dropping (the table in docs/fast_gsap.md):
    python benchmarks/bench_losses.py --batch-sizes 2048 4096 --losses gsap infonce \\
        --impls fast --neg-drop 0 0.5 0.9 0.95 0.99 --paired --reps 3
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

import torch

DIM = 128
PER_CLASS = 4


def takes_temperature(loss: str) -> bool:
    """Whether the registered loss has a ``temperature`` (SigLIP, SoftBin, BlackBox do not)."""
    import inspect

    from rl_gap.losses import get_loss_class

    return "temperature" in inspect.signature(get_loss_class(loss).__init__).parameters


def loss_kwargs(loss: str, impl: str | None, temperature: float | None, neg_drop: float) -> dict:
    kwargs: dict = {}
    if temperature is not None:
        kwargs["temperature"] = temperature
    if loss == "gsap":
        kwargs["impl"] = impl
    if loss in ("gsap", "msap") and neg_drop:
        kwargs["neg_drop"] = neg_drop
    return kwargs


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes(reset_ok: bool) -> int:
    if reset_ok:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(config: dict) -> dict:
    """Run one configuration in this process; return time and peak-memory figures."""
    from rl_gap.losses import build_loss

    device = torch.device(config["device"])
    loss_fn = build_loss(config["loss"], **config["kwargs"]).to(device)

    def make_batch(batch: int):
        gen = torch.Generator().manual_seed(0)
        emb = torch.nn.functional.normalize(torch.randn(batch, DIM, generator=gen), dim=1)
        labels = torch.arange(batch, device=device) // PER_CLASS
        rel = labels.unsqueeze(1) == labels.unsqueeze(0)
        valid = ~torch.eye(batch, dtype=torch.bool, device=device)
        return emb.to(device).requires_grad_(True), rel, valid

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def run_once(emb, rel, valid, fn=None) -> float:
        emb.grad = None
        sync()
        start = time.perf_counter()
        sim = emb @ emb.T
        loss = (fn or loss_fn)(sim, rel, valid)
        loss.backward()
        sync()
        return time.perf_counter() - start

    # One-time library initialisation (thread pools, kernels, autograd engine)
    # on a tiny batch, so the memory figure is the loss's, not the runtime's.
    run_once(*make_batch(2 * PER_CLASS))
    inputs = make_batch(config["batch"])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = _rss_bytes()
        reset_ok = _reset_peak_rss()
    # Memory is the peak of this first full-size run: later runs could reuse
    # memory the allocator kept, which RSS would not show again.
    warm = run_once(*inputs)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        peak = _peak_rss_bytes(reset_ok) - base
    times = []
    paired = []
    ref_times = []
    if config.get("paired"):
        # InfoNCE at the same τ timed in this process, alternating with the loss: on a
        # shared machine the load drifts between processes, much less within one run.
        reference = build_loss("infonce", temperature=config["temperature"] or 0.05).to(device)
        run_once(*inputs, fn=reference)  # its warmup
    if warm <= config["max_seconds"]:
        for _ in range(config["reps"]):
            times.append(run_once(*inputs))
            if config.get("paired"):
                ref_times.append(run_once(*inputs, fn=reference))
                paired.append(times[-1] / ref_times[-1])
    result = {
        "seconds": statistics.median(times) if times else warm,
        "reps": len(times),
        "peak_mib": peak / 2**20,
    }
    if paired:
        result["paired_ratio"] = statistics.median(paired)
        # Load only ever adds time: the best steps of the two are the least disturbed.
        result["best_ratio"] = min(times) / min(ref_times)
    return result


def run_in_subprocess(config: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def native_passes() -> str:
    """Which O(M) passes the fast gSAP kernel uses on CPU (``RL_GAP_NATIVE=0``: torch)."""
    try:
        from rl_gap.losses.fast_sap import native as fast_native
    except ImportError:
        return "torch"
    return "native (C++)" if fast_native.native_library() is not None else "torch"


def fast_available() -> bool:
    from rl_gap.losses.gsap import load_fast_kernel

    return load_fast_kernel() is not None


def build_configs(args: argparse.Namespace) -> list[dict]:
    impls = [i for i in args.impls if i != "fast" or fast_available()]
    skipped = sorted(set(args.impls) - set(impls))
    if skipped:
        print(f"# skipping gsap impl(s) {skipped}: rl_gap.losses.fast_sap.kernel is not importable")
    configs = []
    for batch in args.batch_sizes:
        for loss in args.losses:
            temps = args.temperatures if takes_temperature(loss) else [None]
            for temperature in temps:
                for impl in impls if loss == "gsap" else [None]:
                    drops = args.neg_drop if loss in ("gsap", "msap") else [0.0]
                    for neg_drop in drops:
                        label = f"{loss}-{impl}" if impl else loss
                        configs.append(
                            {
                                "loss": loss,
                                "label": f"{label} a={neg_drop:g}" if neg_drop else label,
                                "impl": impl,
                                "temperature": temperature,
                                "batch": batch,
                                "device": args.device,
                                "reps": args.reps,
                                "max_seconds": args.max_seconds,
                                "paired": args.paired and loss != "infonce",
                                "kwargs": loss_kwargs(loss, impl, temperature, neg_drop),
                            }
                        )
    return configs


def format_table(rows: list[dict]) -> str:
    reference = {}
    for row in rows:
        if row["loss"] == "infonce" and "seconds" in row:
            reference.setdefault(row["batch"], row)
            if row["temperature"] is not None:
                reference[(row["batch"], row["temperature"])] = row
    header = (
        f"{'loss':<18} {'tau':>7} {'B':>5} {'time_s':>9} {'x_infonce':>9} {'best_x':>6} "
        f"{'peak_MiB':>9} {'x_infonce':>9} {'reps':>4}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        tau = "-" if row["temperature"] is None else f"{row['temperature']:g}"
        if "error" in row:
            lines.append(f"{row['label']:<18} {tau:>7} {row['batch']:>5}  ERROR {row['error']}")
            continue
        ref = reference.get((row["batch"], row["temperature"])) or reference.get(row["batch"])
        if "paired_ratio" in row:
            t_ratio = f"{row['paired_ratio']:.2f}p"
        else:
            t_ratio = f"{row['seconds'] / ref['seconds']:.2f}" if ref else "-"
        m_ratio = (
            f"{row['peak_mib'] / ref['peak_mib']:.1f}" if ref and ref["peak_mib"] > 0.5 else "-"
        )
        best = f"{row['best_ratio']:.2f}" if "best_ratio" in row else "-"
        lines.append(
            f"{row['label']:<18} {tau:>7} {row['batch']:>5} {row['seconds']:>9.3f} "
            f"{t_ratio:>9} {best:>6} {row['peak_mib']:>9.1f} {m_ratio:>9} {row['reps']:>4}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.01])
    parser.add_argument(
        "--impls", nargs="+", default=["exact", "fast"], choices=["exact", "fast", "auto"]
    )
    parser.add_argument(
        "--losses",
        nargs="+",
        default=["gsap", "msap", "infonce", "siglip"],
        help="registered loss names to time",
    )
    parser.add_argument(
        "--neg-drop",
        type=float,
        nargs="+",
        default=[0.0],
        help="gsap/msap neg_drop rate(s) α; one row per rate",
    )
    parser.add_argument(
        "--paired",
        action="store_true",
        help="time InfoNCE (same τ) alternately in each worker: x_infonce is the median of "
        "per-step ratios measured in one process (robust to load on a shared machine)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=3, help="timed runs after one warmup")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=60.0,
        help="if the warmup run takes longer, it is the only measurement",
    )
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(measure(json.loads(args.worker))))
        return 0
    from rl_gap.losses import available_losses

    unknown = sorted(set(args.losses) - set(available_losses()))
    if unknown:
        raise SystemExit(f"unknown loss(es) {unknown}; known: {available_losses()}")
    print(f"# device={args.device} threads={torch.get_num_threads()} d={DIM} {PER_CLASS}/class")
    if "gsap" in args.losses and ("fast" in args.impls or "auto" in args.impls):
        print(f"# gsap fast kernel O(M) passes: {native_passes()}")
    rows = []
    for config in build_configs(args):
        result = run_in_subprocess(config) if args.device == "cpu" else measure(config)
        row = {**config, **result}
        rows.append(row)
        status = result.get("error") or f"{result['seconds']:.3f}s {result['peak_mib']:.1f}MiB"
        print(f"# {row['label']} tau={row['temperature']} B={row['batch']}: {status}", flush=True)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
