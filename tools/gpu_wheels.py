"""The wheels a bare GPU machine lacks: download them here, check them, install them there.

    python tools/gpu_wheels.py download        # `make gpu-wheels`: fill .wheels/
    python tools/gpu_wheels.py check           # is .wheels/ complete? (one line, exit 0/1)

The list is ``tools/gpu_wheels.txt`` (``name==version``, the pins of constraints.txt). A wheel
folder is complete when it holds, for every pin, one wheel of that name and version that
CPython 3.12 on manylinux x86-64 can install (a ``py3-none-any``, ``cp312-cp312-manylinux*``
or ``abi3`` wheel) and that is a readable zip whose ``METADATA`` names the same version, and
when the folder stays under the size limit. ``tools/gpu_check.py`` installs the wheels of
the packages the machine lacks with ``pip install --no-index --no-deps --target <tmp>``.
"""

from __future__ import annotations

import argparse
import email.parser
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "tools" / "gpu_wheels.txt"
WHEEL_DIR = ROOT / ".wheels"
SIZE_LIMIT_MIB = 60.0
# The GPU machine's interpreter: what `make gpu-wheels` downloads for.
TARGET_PYTHON = "3.12"
# glibc 2.17 (manylinux2014) up to 2.28: some pins (contourpy 1.3.3) ship only 2.27+ wheels.
TARGET_PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_28_x86_64")
_TARGET_ARGS = [
    "--only-binary=:all:",
    *(arg for p in TARGET_PLATFORMS for arg in ("--platform", p)),
    "--python-version", TARGET_PYTHON,
    "--implementation", "cp",
]  # fmt: skip


def normalise(name: str) -> str:
    """PEP 503 name: ``Pygments`` / ``typeshed_client`` -> ``pygments`` / ``typeshed-client``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Pin:
    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


def read_pins(path: Path = MANIFEST) -> list[Pin]:
    """``name==version`` lines (comments and blank lines skipped); anything else is refused."""
    pins = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)", line)
        if match is None:
            raise ValueError(f"{path}:{number}: expected name==version, got {raw.strip()!r}")
        pins.append(Pin(match.group(1), match.group(2)))
    return pins


def wheel_name_version(filename: str) -> tuple[str, str, str]:
    """(normalised name, version, tags) of a wheel file name (PEP 427)."""
    parts = filename[: -len(".whl")].split("-")
    if not filename.endswith(".whl") or len(parts) not in (5, 6):
        raise ValueError(f"not a wheel file name: {filename}")
    return normalise(parts[0]), parts[1], "-".join(parts[-3:])


def installable_on_target(tags: str) -> bool:
    """Can CPython 3.12 on manylinux x86-64 install a wheel with these ``py-abi-platform`` tags?"""
    py, abi, platform = tags.split("-")
    pys, abis, platforms = py.split("."), abi.split("."), platform.split(".")
    if "any" in platforms:
        return any(p in ("py3", "py312", "cp312") for p in pys) and "none" in abis
    linux = any(p.startswith(("manylinux", "linux_")) and p.endswith("x86_64") for p in platforms)
    if not linux:
        return False
    if "cp312" in abis:
        return "cp312" in pys
    # the stable ABI: a cp3X-abi3 wheel runs on every CPython >= 3.X
    return "abi3" in abis and any(re.fullmatch(r"cp3(\d+)", p) and int(p[3:]) <= 12 for p in pys)


def metadata_version(path: Path) -> tuple[str, str] | None:
    """(name, version) from the wheel's ``*.dist-info/METADATA``, None if unreadable."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            if len(names) != 1:
                return None
            meta = email.parser.Parser().parsestr(zf.read(names[0]).decode("utf-8", "replace"))
    except (zipfile.BadZipFile, OSError):
        return None
    return normalise(meta.get("Name", "")), meta.get("Version", "")


@dataclass
class WheelReport:
    """What a wheel folder holds against the manifest."""

    folder: Path
    wheels: dict[str, Path]  # pin -> wheel file
    missing: list[str]
    broken: list[str]
    size_mib: float

    @property
    def complete(self) -> bool:
        return not self.missing and not self.broken and self.size_mib <= SIZE_LIMIT_MIB

    def line(self) -> str:
        """One line: ready, or what is wrong and how to fix it."""
        where = str(self.folder)
        if not self.folder.is_dir():
            return f"wheel folder {where} does not exist (run `make gpu-wheels`)"
        if self.complete:
            return (
                f"wheel folder {where} complete: {len(self.wheels)} wheels, "
                f"{self.size_mib:.1f} MiB (CPython {TARGET_PYTHON}, manylinux x86-64)"
            )
        problems = []
        if self.missing:
            problems.append(f"missing {', '.join(self.missing)}")
        if self.broken:
            problems.append(f"unusable {', '.join(self.broken)}")
        if self.size_mib > SIZE_LIMIT_MIB:
            problems.append(f"{self.size_mib:.1f} MiB is over the {SIZE_LIMIT_MIB:.0f} MiB limit")
        return f"wheel folder {where} incomplete: {'; '.join(problems)} (run `make gpu-wheels`)"


def check_folder(folder: Path = WHEEL_DIR, pins: list[Pin] | None = None) -> WheelReport:
    """Match the folder's wheels to the pins (name, version, target tags, readable METADATA)."""
    pins = read_pins() if pins is None else pins
    files = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    size = sum(f.stat().st_size for f in files) / 2**20
    wheels, missing, broken = {}, [], []
    for pin in pins:
        found = []
        for f in files:
            try:
                name, version, tags = wheel_name_version(f.name)
            except ValueError:
                continue
            if name == normalise(pin.name) and version == pin.version:
                found.append((f, tags))
        usable = [f for f, tags in found if installable_on_target(tags)]
        if not found:
            missing.append(str(pin))
        elif not usable:
            broken.append(f"{found[0][0].name} (not for CPython {TARGET_PYTHON} manylinux x86-64)")
        elif metadata_version(usable[0]) != (normalise(pin.name), pin.version):
            broken.append(f"{usable[0].name} (not a readable wheel of {pin})")
        else:
            wheels[str(pin)] = usable[0]
    return WheelReport(folder, wheels, missing, broken, size)


def installed_version(name: str) -> str | None:
    """The version of a distribution this interpreter already has, None if absent."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def install(wheels: list[Path], target: Path, for_target_python: bool) -> None:
    """``pip install --no-index --no-deps --target`` the wheel files (no network, no resolver).

    ``for_target_python``: install for CPython 3.12 manylinux x86-64 whatever runs pip (the
    CPU rehearsal on another interpreter proves the files install; it cannot import them).
    """
    if not for_target_python and importlib.util.find_spec("pip") is None:
        unpack(wheels, target)
        return
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    cmd += ["--disable-pip-version-check", "--no-compile", "--target", str(target)]
    if for_target_python:
        cmd += _TARGET_ARGS
    out = subprocess.run(cmd + [str(w) for w in wheels], capture_output=True, text=True)
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"pip install of {len(wheels)} wheels failed: {tail[0]}")


def unpack(wheels: list[Path], target: Path) -> None:
    """Install without pip (a Python that lacks it): a wheel is a zip of its importable tree
    (PEP 427); ``<name>.data/purelib|platlib/`` go to the root, other ``.data`` (scripts, man
    pages) are left out."""
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.infolist():
                parts = member.filename.split("/")
                if parts[0].endswith(".data"):
                    if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                        continue
                    parts = parts[2:]
                if member.is_dir() or ".." in parts or not parts[-1]:
                    continue
                dest = target.joinpath(*parts)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(zf.read(member))
                if member.external_attr >> 16 & 0o111:
                    dest.chmod(0o755)


def download(folder: Path = WHEEL_DIR, pins: list[Pin] | None = None) -> WheelReport:
    """``make gpu-wheels``: fetch each pinned wheel for the GPU machine, then check the folder."""
    pins = read_pins() if pins is None else pins
    folder.mkdir(parents=True, exist_ok=True)
    for pin in pins:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        cmd += ["--disable-pip-version-check", "-d", str(folder), *_TARGET_ARGS, str(pin)]
        subprocess.run(cmd)  # a failed pin shows in the check below, named
    return check_folder(folder, pins)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("download", "check"))
    parser.add_argument("--dir", type=Path, default=WHEEL_DIR, help="wheel folder (.wheels/)")
    args = parser.parse_args(argv)
    report = download(args.dir) if args.action == "download" else check_folder(args.dir)
    if args.action == "download":
        for pin, path in report.wheels.items():
            print(f"{path.stat().st_size / 2**20:8.2f} MiB  {pin:<28} {path.name}")
    print(report.line())
    return 0 if report.complete else 1


if __name__ == "__main__":
    sys.exit(main())
