"""``python -m rl_gap.help_spec``: record the help of rl-gap's commands for replay.

An install runs it once (``make venv``, the Docker image); afterwards ``rl-gap <command>
--help`` is printed from the record without importing torch or Lightning.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from rl_gap.cli import plain_parsers, run_training_command
from rl_gap.help_spec import recording, write_spec


def build(out: Path | None = None) -> Path | None:
    """Build the spec from the live parser (as ``rl-gap``) and write it."""
    if out is not None:
        os.environ["RL_GAP_HELP_SPEC"] = str(out)
    sys.argv[0] = "rl-gap"
    written: list[Path | None] = []
    with (
        open(os.devnull, "w", encoding="utf-8") as sink,
        contextlib.redirect_stdout(sink),
        recording(lambda spec: written.append(write_spec(spec)), plain_parsers()),
        contextlib.suppress(SystemExit),
    ):
        run_training_command(["fit", "--help"])
    if not written or written[0] is None:
        raise SystemExit("rl_gap.help_spec: the help spec could not be recorded or written")
    return written[0]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m rl_gap.help_spec",
        description="Record the help of rl-gap fit/validate/test/predict for replay.",
    )
    parser.add_argument("--out", type=Path, help="spec file (default: rl_gap/help_spec.json)")
    print(f"help spec written to {build(parser.parse_args().out)}")
