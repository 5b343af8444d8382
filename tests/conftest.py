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


@pytest.fixture
def fake_cuda():
    """A fake CUDA device (``tests/fake_cuda.py``): tensors compute on the CPU, report ``cuda:0``."""
    from fake_cuda import fake_cuda_session

    with fake_cuda_session() as device:
        yield device
