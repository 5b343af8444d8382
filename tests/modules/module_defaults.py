"""The defaults ``rl-gap fit --print_config`` shows for a module class (no recipe, no model built)."""

from __future__ import annotations

import contextlib
import io

import pytest
import yaml

from rl_gap.training.cli import run_lightning_cli

BORING_DATA = "lightning.pytorch.demos.boring_classes.BoringDataModule"


def printed_init_args(class_path: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as info:
        run_lightning_cli(["fit", "--model", class_path, "--data", BORING_DATA, "--print_config"])
    assert info.value.code == 0
    return yaml.safe_load(out.getvalue())["model"]["init_args"]
