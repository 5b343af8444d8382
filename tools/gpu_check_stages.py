"""The stages of ``tools/gpu_check.py``; each runs in its own process, under its own time limit.

A stage returns ``{"status": "pass" | "fail" | "skip", "detail": one line, ...figures}``.
``sizes`` comes from ``gpu_check.SIZES`` (the GPU sizes, or the CPU rehearsal's small ones).
"""

from __future__ import annotations

import csv
import inspect
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# |logged (device) - CPU evaluation| and |device evaluation - CPU evaluation|, per metric in
# [0, 1]: the exact engine differs only through float32 GEMM rounding (a near-tie flipping
# moves one query's AP by ~1/#positives, averaged over every query).
METRIC_TOLERANCE = 1e-4
# micro-batched vs full step: loss and every gradient (float32, chunked encoder passes)
MICRO_RTOL, MICRO_ATOL = 1e-4, 1e-6
# Metrics each recipe logs during validation and where `rl-gap predict` writes the same
# embeddings: (split folder, query prefix, database prefix or None = leave-one-out, logged key).
RECIPES = {
    "mnist_gsap": {"pairs": [("test", "", None, "val/")], "args": []},
    "glyphs_gsap": {
        "pairs": [
            (split, q, d, f"val/{split}/{name}_")
            for split in ("glyphs_seen", "glyphs_unseen")
            for q, d, name in (("image_", "text_", "i2t"), ("text_", "image_", "t2i"))
        ],
        "args": [],
    },
    # every evaluated image ranked (the recipe caps the retrieval queries at 1,000)
    "mnist_moco_gsap": {
        "pairs": [("val", "", None, "val/")],
        "args": ["--model.init_args.retrieval_max_queries", "1000000"],
    },
}


def run_logged(cmd: list[str], log: Path, env: dict | None = None) -> None:
    """Run a command, its output appended to ``log``; raise naming the log if it fails."""
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env).returncode
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd[2:5])} ... exited {code} (see {log})")


# --------------------------------------------------------------------------- tests
def device_test_files() -> list[str]:
    """Test files with a test taking the ``fake_cuda`` fixture, and the precision tests."""
    pattern = re.compile(r"def test_\w+\([^)]*\bfake_cuda\b", re.S)
    files = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "tests").rglob("test_*.py"))
        if pattern.search(p.read_text())
    ]
    return files + ["tests/test_precision.py"]


def stage_tests(device: str, out: Path, sizes: dict) -> dict:
    """The device tests (on the real GPU too, ids ``[real_cuda...]``) and the precision tests."""
    xml = out / "tests.xml"
    files = device_test_files()
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "not slow"]
    if sizes["tests_select"]:
        cmd += ["-k", sizes["tests_select"]]
    # no plugin autoload: a plugin installed here but absent there (xdist) must not matter
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    run = subprocess.run(
        cmd + ["--junitxml", str(xml), *files], cwd=ROOT, capture_output=True, text=True, env=env
    )
    (out / "tests.log").write_text(run.stdout + run.stderr)
    counts = {"passed": 0, "failed": 0, "skipped": 0, "real_cuda": 0}
    failed = []
    for case in ET.parse(xml).getroot().iter("testcase") if xml.exists() else []:
        bad = case.find("failure") is not None or case.find("error") is not None
        kind = "failed" if bad else "skipped" if case.find("skipped") is not None else "passed"
        counts[kind] += 1
        counts["real_cuda"] += "real_cuda" in case.get("name", "") or (
            "test_precision" in case.get("classname", "") and "[cuda]" in case.get("name", "")
        )
        if bad:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    if device == "cuda" and counts["real_cuda"] == 0:
        failed.append("no test ran on the real device")
    ok = run.returncode == 0 and not failed and counts["passed"] > 0
    detail = (
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
        f"({counts['real_cuda']} on the real device) in {len(files)} files"
        + (f" (-k '{sizes['tests_select']}')" if sizes["tests_select"] else "")
    )
    if failed:
        detail += "; failing: " + ", ".join(failed[:5]) + (" ..." if len(failed) > 5 else "")
    return {"status": "pass" if ok else "fail", "detail": detail, **counts, "failing": failed}


# ------------------------------------------------------------------------- recipes
def glyph_font_args() -> list[str]:
    """Point the glyph demo at matplotlib's DejaVu fonts when the system has none."""
    from rl_gap.data.glyphs import DEJAVU_CORE_FONTS, DEJAVU_DIR

    if all((Path(DEJAVU_DIR) / name).is_file() for name in DEJAVU_CORE_FONTS):
        return []
    import matplotlib

    return ["--data.init_args.font_dir", str(Path(matplotlib.get_data_path()) / "fonts" / "ttf")]


def logged_metrics(run_dir: Path) -> dict[str, float]:
    """The last validation row of the run's metrics CSV (``val/...`` columns with a value)."""
    rows = list(csv.DictReader((run_dir / "version_0" / "metrics.csv").open()))
    for row in reversed(rows):
        values = {
            k: float(v) for k, v in row.items() if k.startswith("val/") and v not in ("", None)
        }
        if values:
            return values
    raise RuntimeError(f"no validation metrics in {run_dir}/version_0/metrics.csv")


def evaluate(emb_dir: Path, query: str, database: str | None, device: str, target: Path) -> dict:
    """``rl-gap evaluate`` of saved embeddings on ``device`` (in this process)."""
    from rl_gap.cli import main

    argv = ["evaluate", "--queries", str(emb_dir / f"{query}embeddings.npy")]
    argv += ["--query-labels", str(emb_dir / f"{query}labels.npy"), "--no-ceiling"]
    if database is None:
        argv += ["--exclude-self"]
    else:
        argv += ["--database", str(emb_dir / f"{database}embeddings.npy")]
        argv += ["--database-labels", str(emb_dir / f"{database}labels.npy")]
    if main(argv + ["--device", device, "--output", str(target)]) != 0:
        raise RuntimeError(f"rl-gap evaluate {emb_dir} on {device} failed")
    return json.loads(target.read_text())


def max_difference(a: dict, b: dict, keys: list[str]) -> tuple[float, str]:
    worst, name = 0.0, ""
    for k in keys:
        x, y = float(a[k]), float(b[k])
        same = x == y or (math.isnan(x) and math.isnan(y))  # equal infinities (no threshold)
        diff = 0.0 if same else abs(x - y)
        if not diff <= worst:  # NaN against a number counts as a failure
            worst, name = (math.inf if math.isnan(diff) else diff), k
    return worst, name


def stage_recipe(name: str, device: str, out: Path, sizes: dict) -> dict:
    """Fit a demo recipe a few steps (bf16-mixed), predict, evaluate on the device and the CPU."""
    spec = RECIPES[name]
    log, runs = out / f"{name}.log", out / "runs"
    accel = "gpu" if device == "cuda" else "cpu"
    common = ["--config", f"recipes/demo/{name}.yaml", "--output_dir", str(runs), "--wandb", "off"]
    common += ["--trainer.accelerator", accel, "--trainer.devices", "1"]
    common += ["--trainer.precision", "bf16-mixed", *spec["args"]]
    common += glyph_font_args() if name.startswith("glyphs") else []
    cli = [sys.executable, "-m", "rl_gap.cli"]
    fit = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", str(sizes["steps"])]
    fit += ["--trainer.check_val_every_n_epoch", "1", "--trainer.num_sanity_val_steps", "0"]
    started = time.perf_counter()
    run_logged(cli + ["fit", *common, *fit], log)
    fit_s = time.perf_counter() - started
    (ckpt,) = sorted(runs.glob(f"*/{name}/*/checkpoints/last.ckpt"))
    run_dir = ckpt.parents[1]
    run_logged(cli + ["predict", *common, "--ckpt_path", str(ckpt)], log)
    logged = logged_metrics(run_dir)
    compared, worst_logged, worst_device, problems = 0, (0.0, ""), (0.0, ""), []
    for split, query, database, prefix in spec["pairs"]:
        emb_dir = run_dir / "embeddings" / split
        tag = f"{split}-{query or 'all'}"
        on_cpu = evaluate(emb_dir, query, database, "cpu", out / f"{name}-{tag}-cpu.json")
        on_dev = evaluate(emb_dir, query, database, device, out / f"{name}-{tag}-device.json")
        keys = [k for k in on_cpu if f"{prefix}{k}" in logged]
        if not keys:
            problems.append(f"no logged {prefix}* metric matches rl-gap evaluate's keys")
            continue
        compared += len(keys)
        log_view = {k: logged[f"{prefix}{k}"] for k in keys}
        worst_logged = max(worst_logged, max_difference(log_view, on_cpu, keys))
        worst_device = max(worst_device, max_difference(on_dev, on_cpu, list(on_cpu)))
    for label, (diff, key) in (("logged", worst_logged), (f"{device} evaluate", worst_device)):
        if not diff <= METRIC_TOLERANCE:
            problems.append(f"{label} vs CPU evaluation differs by {diff:.2e} on {key}")
    detail = (
        f"fit {sizes['steps']} steps in {fit_s:.0f} s; {compared} logged metrics vs CPU evaluation: "
        f"max abs diff {worst_logged[0]:.1e}; {device} vs CPU evaluation: {worst_device[0]:.1e} "
        f"(tolerance {METRIC_TOLERANCE:g})"
    )
    if problems:
        detail += "; " + "; ".join(problems)
    return {
        "status": "fail" if problems or compared == 0 else "pass",
        "detail": detail,
        "fit_seconds": fit_s,
        "metrics_compared": compared,
        "max_diff_logged_vs_cpu": worst_logged[0],
        "max_diff_device_vs_cpu": worst_device[0],
        "run": str(run_dir),
    }


# --------------------------------------------------------------------------- bench
def stage_bench(device: str, out: Path, sizes: dict) -> dict:
    """``benchmarks/bench_gpu.py`` at the stage's sizes; its rows and ratios."""
    rows_file = out / "bench_gpu.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--device", device]
    cmd += [*sizes["bench"], "--json", str(rows_file)]
    run_logged(cmd, out / "bench_gpu.log")
    rows = json.loads(rows_file.read_text())
    parts = []
    for r in rows:
        if r["time_ratio"] != 1.0:
            batch = "" if r["batch"] is None else f" B={r['batch']}"
            alpha = "" if r["alpha"] is None else f" a={r['alpha']:g}"
            parts.append(f"{r['name']}{batch}{alpha}: {r['time_ratio']:.2f}x")
    return {"status": "pass", "detail": "; ".join(parts), "rows": rows}


# --------------------------------------------------------------------- micro-batch
def micro_batch_available() -> bool:
    from rl_gap.modules.base import RankingModule

    return "micro_batch_size" in inspect.signature(RankingModule.__init__).parameters


def _step(module, batch, device):
    """One training step's loss and gradients (no trainer), its time and peak memory."""
    import torch

    module.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    loss = module.training_step(batch, 0)
    loss.backward()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    grads = {n: p.grad.detach().cpu() for n, p in module.named_parameters() if p.grad is not None}
    return loss.detach().cpu(), grads, seconds, peak


def stage_micro_batch(device: str, out: Path, sizes: dict) -> dict:
    """A micro-batched training step against the full step: same loss and gradients."""
    if not micro_batch_available():
        return {"status": "skip", "detail": "not available: RankingModule has no micro_batch_size"}
    import warnings

    import torch

    from rl_gap.modules import MetricLearningModule

    batch_size, micro = sizes["micro"]
    kwargs = dict(
        backbone="vit_tiny_patch16_224",  # LayerNorm only: micro-batches change no statistics
        backbone_kwargs=dict(img_size=28, patch_size=7, depth=2, embed_dim=96,
                             num_heads=3),
        in_chans=1, dim=64, eval_plots=False, loss={"name": "gsap", "temperature": 0.01},
    )  # fmt: skip
    torch.manual_seed(0)
    full = MetricLearningModule(**kwargs).to(device).train()
    cached = MetricLearningModule(**kwargs, micro_batch_size=micro).to(device).train()
    cached.load_state_dict(full.state_dict())
    g = torch.Generator().manual_seed(1)
    images = torch.randn(batch_size, 1, 28, 28, generator=g)
    batch = [images.to(device), (torch.arange(batch_size) // 4).to(device)]
    batch.append(torch.arange(batch_size, device=device))
    runs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log without a trainer
        for name, module in (("full", full), ("micro", cached)):
            steps = [_step(module, batch, device) for _ in range(sizes["micro_repeats"] + 1)]
            runs[name] = steps[0][:2], statistics.median(s[2] for s in steps[1:]), steps[-1][3]
    (loss_f, grad_f), t_full, mem_full = runs["full"]
    (loss_m, grad_m), t_micro, mem_micro = runs["micro"]
    worst = max(
        float(((grad_m[k] - grad_f[k]).abs() - MICRO_RTOL * grad_f[k].abs()).max()) for k in grad_f
    )
    ok = grad_f.keys() == grad_m.keys() and len(grad_f) > 0 and worst <= MICRO_ATOL
    ok = ok and bool(torch.isclose(loss_m, loss_f, rtol=MICRO_RTOL, atol=MICRO_ATOL))
    mem = "" if mem_full is None else f", peak memory {mem_micro / mem_full:.2f}x"
    return {
        "status": "pass" if ok else "fail",
        "detail": (
            f"B={batch_size}, micro-batches of {micro}: loss {float(loss_m):.6f} vs "
            f"{float(loss_f):.6f}, gradients within rtol {MICRO_RTOL:g} + atol {MICRO_ATOL:g}: "
            f"{'yes' if worst <= MICRO_ATOL else f'no (excess {worst:.1e})'}; "
            f"time {t_micro / t_full:.2f}x{mem}"
        ),
        "time_ratio": t_micro / t_full,
        "memory_ratio": None if mem_full is None else mem_micro / mem_full,
    }


def run_stage(name: str, device: str, out: Path, sizes: dict) -> dict:
    if name == "tests":
        return stage_tests(device, out, sizes)
    if name == "bench":
        return stage_bench(device, out, sizes)
    if name == "micro_batch":
        return stage_micro_batch(device, out, sizes)
    if name.startswith("recipe:"):
        return stage_recipe(name.split(":", 1)[1], device, out, sizes)
    raise ValueError(f"unknown stage {name!r}")
