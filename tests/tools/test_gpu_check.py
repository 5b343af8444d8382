"""tools/gpu_check.py and tools/gpu_wheels.py: the wheel folder check, the no-CUDA exit,
and (slow) the whole CPU rehearsal of `make gpu-check`. Wheels here are small stand-ins built
in a temporary folder (name, version, tags, METADATA), never downloaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import gpu_check  # noqa: E402
import gpu_wheels  # noqa: E402

LINUX = "cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64"


def make_wheel(folder: Path, name: str, version: str, tags: str = "py3-none-any", meta=None):
    """A minimal installable wheel: METADATA (name/version), WHEEL, RECORD."""
    stem = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{stem}-{tags}.whl"
    info = f"{stem}.dist-info"
    meta_name, meta_version = meta or (name, version)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {meta_name}\n"
                    f"Version: {meta_version}\n")  # fmt: skip
        zf.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tags}\n")
        zf.writestr(f"{info}/RECORD", f"{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    return path


def full_folder(folder: Path) -> Path:
    folder.mkdir()
    for pin in gpu_wheels.read_pins():
        make_wheel(folder, pin.name, pin.version)
    return folder


def test_manifest_pins_are_the_locked_versions():
    lock = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.strip().split("==")
            lock[gpu_wheels.normalise(name)] = version
    pins = gpu_wheels.read_pins()
    assert len(pins) >= 20
    for pin in pins:
        assert lock.get(gpu_wheels.normalise(pin.name)) == pin.version, pin
    carried = {gpu_wheels.normalise(p.name) for p in pins}
    # the machine's own stack is never carried (its torch is the one the check proves)
    assert not carried & {"torch", "lightning", "timm", "torchmetrics", "numpy", "wandb"}


def test_target_tags():
    ok = gpu_wheels.installable_on_target
    assert ok("py3-none-any") and ok(LINUX) and ok("cp310-abi3-manylinux2014_x86_64")
    assert ok("cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64")
    assert not ok("cp311-cp311-manylinux2014_x86_64")  # another CPython
    assert not ok("cp313-abi3-manylinux2014_x86_64")  # stable ABI from a newer CPython
    assert not ok("cp312-cp312-macosx_11_0_arm64") and not ok("cp312-cp312-win_amd64")
    assert not ok("cp312-cp312-manylinux2014_aarch64") and not ok("py2-none-any")


def test_no_cuda_exits_2_with_one_line_when_the_wheels_are_complete(tmp_path):
    folder = full_folder(tmp_path / "wheels")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--wheels", str(folder),
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    (line,) = out.stdout.splitlines()
    assert line.startswith("gpu-check: no CUDA device") and "nothing was run" in line
    n = len(gpu_wheels.read_pins())
    assert f"{folder} complete: {n} wheels" in line
    assert not (tmp_path / "out").exists()  # no stage ran


def no_cuda_line(monkeypatch, capsys, folder: Path) -> tuple[int, str]:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = gpu_check.main(["--wheels", str(folder)])
    (line,) = capsys.readouterr().out.splitlines()
    return code, line


def test_no_cuda_names_a_missing_wheel_folder(tmp_path, monkeypatch, capsys):
    code, line = no_cuda_line(monkeypatch, capsys, tmp_path / "absent")
    assert code == 1
    assert f"wheel folder {tmp_path / 'absent'} does not exist (run `make gpu-wheels`)" in line


def test_no_cuda_names_each_missing_or_unusable_wheel(tmp_path, monkeypatch, capsys):
    folder = full_folder(tmp_path / "wheels")
    pins = {gpu_wheels.normalise(p.name): p for p in gpu_wheels.read_pins()}
    regex, rich, mlxtend = pins["regex"], pins["rich"], pins["mlxtend"]
    for pin in (regex, rich, mlxtend):
        next(folder.glob(f"{pin.name.replace('-', '_')}-*.whl")).unlink()
    make_wheel(folder, "regex", regex.version, "cp312-cp312-macosx_11_0_arm64")  # wrong platform
    make_wheel(folder, "rich", "0.1")  # another version: still missing
    (folder / f"mlxtend-{mlxtend.version}-py3-none-any.whl").write_bytes(b"truncated")
    code, line = no_cuda_line(monkeypatch, capsys, folder)
    assert code == 1 and "incomplete" in line and "run `make gpu-wheels`" in line
    assert f"missing {rich}" in line
    assert f"regex-{regex.version}-cp312-cp312-macosx_11_0_arm64.whl (not for CPython 3.12" in line
    assert f"mlxtend-{mlxtend.version}-py3-none-any.whl (not a readable wheel of {mlxtend})" in line


def test_wheel_whose_metadata_disagrees_is_unusable(tmp_path):
    folder = full_folder(tmp_path / "wheels")
    pin = gpu_wheels.read_pins()[0]
    next(folder.glob(f"{pin.name.replace('-', '_')}-*.whl")).unlink()
    make_wheel(folder, pin.name, pin.version, meta=(pin.name, "0.0.1"))
    report = gpu_wheels.check_folder(folder)
    assert not report.complete and report.broken and str(pin) in report.broken[0]


def test_size_limit(tmp_path, monkeypatch):
    folder = full_folder(tmp_path / "wheels")
    assert gpu_wheels.check_folder(folder).complete
    monkeypatch.setattr(gpu_wheels, "SIZE_LIMIT_MIB", 0.001)
    report = gpu_wheels.check_folder(folder)
    assert not report.complete and "over the 0 MiB limit" in report.line()


def test_manifest_lines_are_checked(tmp_path):
    bad = tmp_path / "pins.txt"
    bad.write_text("# ok\nrich==15.0.0\nregex>=2026\n")
    with pytest.raises(ValueError, match=r"pins.txt:3: expected name==version, got 'regex>=2026'"):
        gpu_wheels.read_pins(bad)


@pytest.mark.slow
def test_cpu_rehearsal_runs_every_stage(tmp_path):
    """`make gpu-check DEVICE=cpu`: every stage passes on a bare-machine view of this venv."""
    folder = full_folder(tmp_path / "wheels")
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--device", "cpu",
         "--wheels", str(folder), "--out", str(out)],
        capture_output=True, text=True, timeout=3000,
    )  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert run.returncode == 0, run.stdout[-3000:]
    assert summary["passed"] and summary["mode"] == "CPU rehearsal"
    stages = {s["name"]: s for s in summary["stages"]}
    assert list(stages) == ["wheels", *gpu_check.STAGES]
    assert len(stages["wheels"]["installed"]) == len(gpu_wheels.read_pins())
    assert "modules hidden" in stages["wheels"]["detail"]
    assert stages["tests"]["passed"] >= 40 and stages["tests"]["failed"] == 0
    for name in gpu_check.STAGES:
        if name.startswith("recipe:"):
            s = stages[name]
            assert s["metrics_compared"] >= 4, s
            assert s["max_diff_logged_vs_cpu"] <= 1e-4 and s["max_diff_device_vs_cpu"] <= 1e-4
    assert {r["name"] for r in stages["bench"]["rows"]} >= {"infonce", "gsap fast"}
    assert stages["micro_batch"]["status"] in ("pass", "skip")
    table = (out / "summary.md").read_text()
    assert "| stage | status |" in table and "| recipe:glyphs_gsap | pass |" in table


def test_metric_comparison_and_logged_row(tmp_path):
    import gpu_check_stages as stages

    a = {"gap": 0.5, "map": float("nan"), "r@1": 0.25}
    assert stages.max_difference(a, {"gap": 0.5, "map": float("nan"), "r@1": 0.2}, list(a)) == (
        pytest.approx(0.05),
        "r@1",
    )
    assert stages.max_difference(a, {**a, "map": 0.1}, list(a)) == (float("inf"), "map")
    inf = {"threshold_p90": float("inf")}  # no threshold reaches the precision, on both sides
    assert stages.max_difference(inf, dict(inf), list(inf)) == (0.0, "")
    assert stages.max_difference(inf, {"threshold_p90": 0.9}, list(inf))[0] == float("inf")
    csv_dir = tmp_path / "run" / "version_0"
    csv_dir.mkdir(parents=True)
    (csv_dir / "metrics.csv").write_text(
        "epoch,step,train/loss,val/gap,val/r@1\n0,1,0.5,,\n0,1,,0.25,0.5\n0,2,0.4,,\n"
    )
    assert stages.logged_metrics(tmp_path / "run") == {"val/gap": 0.25, "val/r@1": 0.5}


def test_unpack_without_pip(tmp_path):
    wheel = make_wheel(tmp_path, "demo-pkg", "1.0")
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("demo_pkg/__init__.py", "VALUE = 3\n")
        zf.writestr("demo_pkg-1.0.data/purelib/demo_extra.py", "EXTRA = 4\n")
        zf.writestr("demo_pkg-1.0.data/scripts/demo", "#!/bin/sh\n")
    target = tmp_path / "site"
    gpu_wheels.unpack([wheel], target)
    assert (target / "demo_pkg" / "__init__.py").read_text() == "VALUE = 3\n"
    assert (target / "demo_extra.py").read_text() == "EXTRA = 4\n"
    assert (target / "demo_pkg-1.0.dist-info" / "METADATA").is_file()
    assert not list(target.glob("*.data")) and not (target / "demo").exists()


def test_bare_machine_view_hides_what_the_wheels_do_not_bring(tmp_path):
    pins = {gpu_wheels.normalise(p.name) for p in gpu_wheels.read_pins()}
    allowed = gpu_check.machine_closure() | (pins - {"rich"})
    assert {"torch", "lightning", "timm", "scipy", "numpy"} <= allowed
    blocked = gpu_check.bare_site(tmp_path, allowed)
    assert "rich" in blocked and "wandb" in blocked and "torch" not in blocked
    probe = (
        "import importlib.util, sys, yaml\n"
        "assert importlib.util.find_spec('rich') is None and importlib.util.find_spec('yaml')\n"
        "try:\n    import wandb\nexcept ModuleNotFoundError:\n    sys.exit(0)\nsys.exit(3)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
