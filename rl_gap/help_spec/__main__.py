"""``python -m rl_gap.help_spec``: record the help of rl-gap's commands for replay.

An install runs it once (``make venv``, the Docker image); afterwards ``rl-gap <command>
--help`` is printed from the record without importing torch or Lightning.

The record is what a live ``rl-gap fit --help`` writes (:func:`rl_gap.help_spec.recording`
around the parser), so this runs exactly that command in a child process, the way a user
would, with the spec path fixed and a fresh page folder (a stored page of ``fit --help``
would otherwise answer before the parser is built). The help record stays below the command
line: nothing here imports :mod:`rl_gap.cli`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rl_gap import help_spec


def _target() -> Path | None:
    """The first spec path that can be written (where a live help would write it)."""
    for path in help_spec.spec_paths():
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if os.access(folder, os.W_OK):
            return path
    return None


def build(out: Path | None = None) -> Path:
    """Record the spec by running ``rl-gap fit --help`` live; its path.

    Raises:
        SystemExit: no writable spec path, the command failed, or it left no valid spec.
    """
    target = out if out is not None else _target()
    if target is None:
        raise SystemExit("rl_gap.help_spec: no writable place for the help spec")
    with tempfile.TemporaryDirectory() as pages:
        env = {**os.environ, "RL_GAP_HELP_SPEC": str(target), "RL_GAP_CACHE": pages}
        env.pop("RL_GAP_HELP_CACHE", None)
        cmd = [sys.executable, "-m", "rl_gap.cli", "fit", "--help"]
        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=False)
    before = os.environ.get("RL_GAP_HELP_SPEC")
    os.environ["RL_GAP_HELP_SPEC"] = str(target)  # load_valid_spec reads the one just written
    try:
        valid = done.returncode == 0 and help_spec.load_valid_spec() is not None
    finally:
        if before is None:
            os.environ.pop("RL_GAP_HELP_SPEC")
        else:
            os.environ["RL_GAP_HELP_SPEC"] = before
    if not valid:
        raise SystemExit(
            f"rl_gap.help_spec: the help spec could not be recorded at {target}"
            f" (rl-gap fit --help exited {done.returncode})"
        )
    return target


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m rl_gap.help_spec",
        description="Record the help of rl-gap fit/validate/test/predict for replay.",
    )
    parser.add_argument("--out", type=Path, help="spec file (default: rl_gap/help_spec.json)")
    print(f"help spec written to {build(parser.parse_args().out)}")
