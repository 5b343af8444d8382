"""``make gpu-check``: one command that proves a GPU run, each stage under its own time limit.

    python tools/gpu_check.py                      # on a GPU machine (under 8 minutes on an H200)
    python tools/gpu_check.py --device cpu         # the rehearsal: same stages, small sizes
    python tools/gpu_check.py --stages tests bench --out runs/gpu-check

Stages (docs/gpu.md):

- ``wheels``: the wheel folder (``.wheels/``, ``make gpu-wheels``) holds every pin of
  ``tools/gpu_wheels.txt``; those the machine lacks are installed with
  ``pip install --no-index --no-deps --target <tmp>``, which goes on ``PYTHONPATH`` (the
  machine's own torch is used). The rehearsal installs them all for CPython 3.12 manylinux
  x86-64 (proving they install) and, unless ``--no-bare``, hides from its stages every package a
  bare GPU machine lacks and the wheels do not bring (proving the list is complete).
- ``tests``: the test files using the ``fake_cuda`` fixture (it adds the real device where
  one exists) and ``tests/test_precision.py``.
- ``recipe:<name>``: fit a demo recipe a few dozen steps with ``bf16-mixed`` on the device,
  ``rl-gap predict``, ``rl-gap evaluate`` on the device and on the CPU; the metrics logged
  during the fit and the device evaluation must equal the CPU evaluation of the same embeddings.
- ``bench``: ``benchmarks/bench_gpu.py`` (fast gSAP vs InfoNCE at B = 4,096 and 16,384, α ∈
  {0, 0.9}; the engine on 60k x 60k, d = 512, vs the bare GEMM).
- ``micro_batch``: a micro-batched training step vs the full step (skipped, saying so, where
  the base module has no ``micro_batch_size``).

Writes ``summary.md`` and ``summary.json`` (pass/fail, figures, ratios) and each stage's log to
``--out``. Exit status: 0 every stage passed (or was skipped); 1 a stage failed or ran out of
time; 2 no CUDA device (one line, after checking the wheel folder: 1 instead if it is
incomplete, so the preparation is checked on any machine).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_wheels  # noqa: E402  (a sibling script)

ROOT = gpu_wheels.ROOT
STAGES = ["tests", "recipe:mnist_gsap", "recipe:glyphs_gsap", "recipe:mnist_moco_gsap"]
STAGES += ["bench", "micro_batch"]
# Sizes and per-stage limits (seconds). On an H200 the whole run fits in `budget`; the CPU
# rehearsal is for a small shared machine.
SIZES = {
    "cuda": {
        "steps": 30,
        # the real-device tests and the precision tests (the fake-device ones run in CI)
        "tests_select": "real_cuda or precision",
        "bench": ["--batches", "4096", "16384", "--alphas", "0", "0.9", "--engine-size", "60000",
                  "--repeats", "3"],
        "micro": (4096, 512),
        "micro_repeats": 3,
        "limits": {"tests": 110, "recipe": 80, "bench": 80, "micro_batch": 25},
        "budget": 460,
    },
    "cpu": {
        "steps": 2,
        "tests_select": None,
        "bench": ["--batches", "64", "--alphas", "0", "0.9", "--engine-size", "500", "--dim",
                  "32", "--repeats", "1"],
        "micro": (32, 8),
        "micro_repeats": 1,
        "limits": {"tests": 900, "recipe": 900, "bench": 300, "micro_batch": 300},
        "budget": 3600,
    },
}  # fmt: skip
# What a bare GPU machine has (with their own dependencies): docs/gpu.md.
MACHINE_HAS = ("torch", "lightning", "timm", "torchmetrics", "scikit-learn", "scipy")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu-check")
    parser.add_argument("--wheels", type=Path, default=gpu_wheels.WHEEL_DIR)
    parser.add_argument("--stages", nargs="+", default=STAGES, choices=STAGES)
    parser.add_argument(
        "--no-bare", action="store_true", help="rehearsal: keep this environment's packages"
    )
    parser.add_argument("--run-stage", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ----------------------------------------------------------------------- wheels
def machine_closure(roots=MACHINE_HAS) -> set[str]:
    """Normalised names of ``roots`` and everything they require (markers evaluated here)."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    seen: set[str] = set()
    stack = list(roots)
    while stack:
        name = gpu_wheels.normalise(stack.pop())
        if name in seen:
            continue
        try:
            requires = md.distribution(name).requires or []
        except md.PackageNotFoundError:
            continue
        seen.add(name)
        for spec in requires:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                stack.append(req.name)
    return seen


def bare_site(folder: Path, allowed: set[str]) -> list[str]:
    """A ``sitecustomize`` that hides the packages outside ``allowed``; returns their modules."""
    import importlib.metadata as md

    blocked = sorted(
        module
        for module, dists in md.packages_distributions().items()
        if not module.startswith("_")
        and module not in sys.stdlib_module_names
        and not any(gpu_wheels.normalise(d) in allowed for d in dists)
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import sys\n"
        "from importlib.machinery import PathFinder\n\n"
        f"BLOCKED = frozenset({blocked!r})\n\n\n"
        "class BareMachine(PathFinder):\n"
        "    @classmethod\n"
        "    def find_spec(cls, name, path=None, target=None):\n"
        "        if name.partition('.')[0] in BLOCKED:\n"
        "            return None  # as if not installed (find_spec probes see None too)\n"
        "        return PathFinder.find_spec(name, path, target)\n\n\n"
        "sys.meta_path[:] = [BareMachine if f is PathFinder else f for f in sys.meta_path]\n"
    )
    return blocked


def prepare_wheels(args: argparse.Namespace, tmp: Path) -> tuple[dict, list[str]]:
    """The wheels stage; returns its result and the folders its successors need on PYTHONPATH."""
    report = gpu_wheels.check_folder(args.wheels)
    if not report.complete:
        return {"status": "fail", "detail": report.line()}, []
    pins = gpu_wheels.read_pins()
    have = {str(p): gpu_wheels.installed_version(p.name) for p in pins}
    rehearsal = args.device == "cpu"
    lacking = [p for p in pins if rehearsal or have[str(p)] is None]
    target = tmp / "site"
    if lacking:
        gpu_wheels.install([report.wheels[str(p)] for p in lacking], target, rehearsal)
    own = ", ".join(f"{n} {gpu_wheels.installed_version(n)}" for n in MACHINE_HAS)
    present = [f"{p.name} {have[str(p)]}" for p in pins if have[str(p)] is not None]
    detail = f"{report.line()}; installed {len(lacking)} into {target}"
    if rehearsal:
        detail += f" for CPython {gpu_wheels.TARGET_PYTHON} (this interpreter keeps its own)"
    else:
        detail += f"; the machine's own: {own}"
        detail += f"; already present: {', '.join(present)}" if present else ""
    paths = [] if rehearsal else [str(target)]
    if rehearsal and not args.no_bare:
        allowed = machine_closure() | {gpu_wheels.normalise(p.name) for p in pins} | {"rl-gap"}
        blocked = bare_site(tmp / "bare", allowed)
        paths.insert(0, str(tmp / "bare"))
        detail += f"; stages see a bare machine ({len(blocked)} modules hidden)"
    return {"status": "pass", "detail": detail, "installed": [str(p) for p in lacking]}, paths


# ----------------------------------------------------------------------- stages
def stage_env(device: str, paths: list[str]) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    env.update(WANDB_MODE="disabled", WANDB_SILENT="true", PYTHONHASHSEED="0")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_stage_process(name: str, args, env: dict, limit: float) -> dict:
    """Run one stage in its own process group; kill the group at ``limit`` seconds."""
    folder = args.out / name.replace(":", "-")
    folder.mkdir(parents=True, exist_ok=True)
    result = folder / "result.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run-stage", name]
    cmd += ["--device", args.device, "--out", str(folder), "--result", str(result)]
    with (folder / "stage.log").open("w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"status": "timeout", "detail": f"stopped at its {limit:.0f} s limit"}
    if not result.exists():
        return {"status": "fail", "detail": f"exited {proc.returncode} without a result (see log)"}
    return json.loads(result.read_text())


def child(args: argparse.Namespace) -> int:
    """Inside a stage process: run the stage, write its result (a failure is a result too)."""
    import gpu_check_stages

    try:
        result = gpu_check_stages.run_stage(
            args.run_stage, args.device, args.out, SIZES[args.device]
        )
    except Exception as err:  # noqa: BLE001  (reported in the summary, traceback in the log)
        traceback.print_exc()
        result = {"status": "fail", "detail": f"{type(err).__name__}: {err}".splitlines()[0]}
    args.result.write_text(json.dumps(result, indent=2, default=str))
    return 0


# ---------------------------------------------------------------------- summary
def environment(device: str) -> dict:
    import torch

    name = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "CPU"
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "mode": "GPU" if device == "cuda" else "CPU rehearsal",
    }


def write_summary(out: Path, env: dict, stages: list[dict]) -> str:
    ok = all(s["status"] in ("pass", "skip") for s in stages)
    lines = [
        f"# gpu-check: {'PASS' if ok else 'FAIL'} ({env['mode']})",
        "",
        f"{env['date']}; {env['device']}; torch {env['torch']} (CUDA {env['cuda']}); "
        f"Python {env['python']}",
        "",
        "| stage | status | seconds | limit | detail |",
        "|---|---|---:|---:|---|",
    ]
    for s in stages:
        detail = str(s.get("detail", "")).replace("|", "/")
        limit = f"{s['limit']:.0f}" if s["limit"] else "-"
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.0f} | {limit} | {detail} |")
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    summary = {"passed": ok, **env, "stages": stages}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run_stage:
        return child(args)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        report = gpu_wheels.check_folder(args.wheels)
        print(
            f"gpu-check: no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is "
            f"False), nothing was run (--device cpu rehearses on the CPU); {report.line()}"
        )
        return 2 if report.complete else 1
    sizes = SIZES[args.device]
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + sizes["budget"]
    results = []
    with tempfile.TemporaryDirectory(prefix="rl_gap-gpu-check-") as tmp:
        started = time.monotonic()
        try:
            wheels, paths = prepare_wheels(args, Path(tmp))
        except RuntimeError as err:
            wheels, paths = {"status": "fail", "detail": str(err)}, []
        results.append({"name": "wheels", "seconds": time.monotonic() - started, "limit": 0,
                        **wheels})  # fmt: skip
        env = stage_env(args.device, paths)
        for name in args.stages if wheels["status"] == "pass" else []:
            limit = min(sizes["limits"][name.split(":")[0]], deadline - time.monotonic())
            started = time.monotonic()
            if limit <= 0:
                result = {"status": "timeout", "detail": "the run's time budget was spent"}
            else:
                result = run_stage_process(name, args, env, limit)
            results.append({"name": name, "seconds": time.monotonic() - started,
                            "limit": max(limit, 0), **result})  # fmt: skip
            print(f"gpu-check: {name}: {result['status']}: {result.get('detail', '')}", flush=True)
    text = write_summary(args.out, environment(args.device), results)
    print(text + f"summary: {args.out / 'summary.md'} and summary.json")
    return 0 if all(r["status"] in ("pass", "skip") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
