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


def _cuda_kinds() -> list[str]:
    import torch

    return ["fake_cuda", "real_cuda"] if torch.cuda.is_available() else ["fake_cuda"]


@pytest.fixture(params=_cuda_kinds())
def fake_cuda(request):
    """A CUDA device for device tests: the fake one (``tests/fake_cuda.py``: tensors compute on
    the CPU, report ``cuda:0``) always, and the real ``cuda:0`` too where one exists (test ids
    ``[fake_cuda]`` / ``[real_cuda]``; ``make gpu-check`` runs them on a GPU machine)."""
    from fake_cuda import RealCuda, fake_cuda_session

    if request.param == "real_cuda":
        yield RealCuda()
        return
    with fake_cuda_session() as device:
        yield device


@pytest.fixture
def fake_cuda_device():
    """The fake CUDA device only: for the tests of the fake device itself."""
    from fake_cuda import fake_cuda_session

    with fake_cuda_session() as device:
        yield device
