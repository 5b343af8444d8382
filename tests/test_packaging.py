"""Packaging: shipped recipes and C++ sources, the native build cache and its lock."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rl_gap import native_build
from rl_gap.resources import available_recipes, recipe_path

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ recipes
def test_recipe_path_resolves_every_recipe_in_the_repository():
    on_disk = sorted(p.relative_to(REPO / "recipes").with_suffix("").as_posix()
                     for p in (REPO / "recipes").glob("*/*.yaml"))  # fmt: skip
    assert available_recipes() == on_disk and "demo/mnist_gsap" in on_disk
    for name in ("demo/mnist_gsap", "demo/mnist_gsap.yaml", "recipes/demo/mnist_gsap.yaml"):
        path = recipe_path(name)
        assert path.read_bytes() == (REPO / "recipes/demo/mnist_gsap.yaml").read_bytes()
    with pytest.raises(FileNotFoundError, match=r"no recipe 'demo/mnist_gsapp'.*demo/mnist_gsap"):
        recipe_path("demo/mnist_gsapp")


def test_install_requires_are_lower_bounds_and_constraints_pin_them():
    """`pip install .` must not replace an environment's torch/numpy: no `==` in setup.cfg;
    every requirement (extras included) is pinned exactly in constraints.txt."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    reqs = [r.strip() for r in cfg["options"]["install_requires"].splitlines() if r.strip()]
    extras = cfg["options.extras_require"]
    reqs += [r.strip() for k in extras for r in extras[k].splitlines() if r.strip()]
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    for req in reqs:
        assert "==" not in req and ">=" in req, req
        name = req.split(">=")[0].split("[")[0].lower().replace("_", "-")
        assert name in pins, f"{name} not pinned in constraints.txt"
    assert pins["torch"] == "2.14.1" and pins["optuna"] == "5.0.0"
    runtime = {
        r.split(">=")[0].split("[")[0].strip().lower()
        for r in cfg["options"]["install_requires"].splitlines()
        if r.strip()
    }
    # a runtime requirement exactly when the package imports it at module level (optuna is
    # imported lazily by `rl-gap tune`, hence its own extra)
    module_level = set()
    for path in (REPO / "rl_gap").rglob("*.py"):
        for line in path.read_text().splitlines():
            found = re.match(r"(?:import|from) (yaml|scipy|sklearn|optuna)\b", line)
            if found:
                module_level.add(found.group(1))
    for module, dist in (("yaml", "pyyaml"), ("scipy", "scipy"), ("sklearn", "scikit-learn"),
                         ("optuna", "optuna")):  # fmt: skip
        assert (dist in runtime) == (module in module_level), (module, dist)


@pytest.mark.slow
def test_wheel_ships_recipes_and_cpp_sources(tmp_path):
    """Build a wheel from a copy of the sources, install it with --no-deps into a folder
    and, from outside the repository, resolve the demo recipe and compile a helper."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    shutil.copytree(REPO / "rl_gap", src / "rl_gap", symlinks=True, ignore=ignore)
    shutil.copytree(REPO / "recipes", src / "recipes")
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "whl"), str(src)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = (tmp_path / "whl").glob("rl_gap-*.whl")
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True)
    probe = textwrap.dedent(
        """
        import rl_gap, rl_gap.demo
        from rl_gap.resources import recipe_path
        from rl_gap.metrics.functional import native
        print(rl_gap.__file__)
        print(recipe_path("demo/mnist_gsap"))
        print(native._LIBRARY.source, native.native_library() is not None)
        from rl_gap.losses.fast_sap import native as fast_native
        print(fast_native._LIBRARY.source, fast_native.native_library() is not None)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(site), "RL_GAP_CACHE": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    module, recipe, native, fast_native = out.stdout.split("\n")[:4]
    assert Path(module).is_relative_to(site)
    assert Path(recipe).is_relative_to(site) and not Path(recipe).is_symlink()
    assert Path(recipe).read_bytes() == (REPO / "recipes/demo/mnist_gsap.yaml").read_bytes()
    for library in (native, fast_native):  # each built from the wheel's sources and headers
        source, built = library.split()
        assert Path(source).is_relative_to(site) and Path(source).is_file() and built == "True"


# ------------------------------------------------------------- native cache
def test_cache_dir_honours_rl_gap_cache_then_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("RL_GAP_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert native_build.cache_dir() == tmp_path / "xdg" / "rl_gap"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # invalid per the XDG spec
    assert native_build.cache_dir() == Path.home() / ".cache" / "rl_gap"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert native_build.cache_dir() == Path.home() / ".cache" / "rl_gap"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("RL_GAP_CACHE", str(tmp_path / "mine"))
    assert native_build.cache_dir() == tmp_path / "mine"


_CHILD = """
import ctypes, sys, time
from pathlib import Path
from rl_gap.native_build import NativeLibrary

def declare(lib):
    lib.rl_gap_probe.restype = ctypes.c_int

lib = NativeLibrary(Path(sys.argv[1]), "rl_gap_probe", declare, flags=("-O0", "-shared", "-fPIC"))
while time.time() < float(sys.argv[2]):  # start the builds together
    time.sleep(0.005)
print(lib.load().rl_gap_probe())
"""


def test_concurrent_processes_compile_once(tmp_path):
    """Four processes (DDP ranks) building the same helper at once: one compile, and every
    process loads a complete library."""
    source = tmp_path / "probe.cpp"
    source.write_text('extern "C" int rl_gap_probe() { return 4321; }\n')
    log = tmp_path / "compiles.log"
    cxx = tmp_path / "cxx"
    compiler = shutil.which("g++") or shutil.which("c++")
    assert compiler, "no C++ compiler"
    cxx.write_text(f'#!/bin/sh\necho "$$" >> {log}\nsleep 1\nexec {compiler} "$@"\n')
    cxx.chmod(0o755)
    env = {**os.environ, "CXX": str(cxx), "RL_GAP_CACHE": str(tmp_path / "cache")}
    env["PYTHONPATH"] = str(REPO)
    start = str(time.time() + 1.5)
    procs = [
        subprocess.Popen([sys.executable, "-c", _CHILD, str(source), start], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]  # fmt: skip
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert out.strip() == "4321"
    assert len(log.read_text().split()) == 1
    built = list((tmp_path / "cache").glob("rl_gap_probe_*"))
    assert sorted(p.suffix for p in built) == [".lock", ".so"]  # no temporary file left


def test_native_1_makes_every_failed_build_an_error(monkeypatch, tmp_path):
    """RL_GAP_NATIVE=1 (set by `make test`): a failed build raises at every use, so a test
    that asks for the helper later fails instead of skipping; default: warn, fall back."""
    source = tmp_path / "probe.cpp"
    source.write_text('extern "C" int rl_gap_probe() { return 1; }\n')
    monkeypatch.setenv("RL_GAP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", shutil.which("false") or "/bin/false")
    monkeypatch.setenv("RL_GAP_NATIVE", "1")
    lib = native_build.NativeLibrary(source, "rl_gap_probe", lambda lib: None, what="probe")
    for _ in range(2):
        with pytest.raises(RuntimeError, match="rl_gap probe unavailable"):
            lib.load()
    monkeypatch.delenv("RL_GAP_NATIVE")
    fallback = native_build.NativeLibrary(source, "rl_gap_probe", lambda lib: None, what="probe")
    with pytest.warns(UserWarning, match="probe unavailable"):
        assert fallback.load() is None
    assert fallback.load() is None and not fallback.enabled()


def test_edited_header_builds_afresh(monkeypatch, tmp_path):
    """A helper's local headers (found from its ``#include "..."`` lines) are part of its
    build key: editing one builds a new library that returns the new value, not the cached
    one."""
    import ctypes

    source, header = tmp_path / "probe.cpp", tmp_path / "probe_value.h"
    source.write_text('#include "probe_value.h"\nextern "C" int rl_gap_probe() { return VALUE; }\n')
    monkeypatch.setenv("RL_GAP_CACHE", str(tmp_path / "cache"))

    def declare(lib):
        lib.rl_gap_probe.restype = ctypes.c_int

    def probe() -> int:
        lib = native_build.NativeLibrary(
            source, "rl_gap_probe", declare, flags=("-O0", "-shared", "-fPIC")
        )
        return lib.load().rl_gap_probe()

    header.write_text("#define VALUE 17\n")
    assert probe() == 17
    header.write_text("#define VALUE 23\n")
    assert probe() == 23
    assert len(list((tmp_path / "cache").glob("rl_gap_probe_*.so"))) == 2


def test_readme_recipe_paths_resolve_outside_a_checkout(tmp_path, monkeypatch, capsys):
    """`rl-gap fit --config recipes/...` from any folder uses the recipe shipped in the package."""
    from rl_gap.cli import main

    monkeypatch.chdir(tmp_path)
    assert not (tmp_path / "recipes").exists()
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "recipes/demo/mnist_gsap.yaml", "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "MetricLearningModule" in printed and "name: gsap" in printed
    # a name that is no shipped recipe is still a clear error naming it
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "recipes/demo/no_such_recipe.yaml", "--print_config"])
    assert exit_info.value.code == 2
    assert "no_such_recipe.yaml" in capsys.readouterr().err
