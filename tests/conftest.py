"""Shared test settings: W&B offline and quiet, runs written under a temporary folder."""

import os

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_DISABLE_GIT", "true")


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """A temporary output root for CLI runs (``--output_dir``); W&B files stay inside it."""
    out = tmp_path / "runs"
    monkeypatch.setenv("WANDB_DIR", str(out))
    return out
