"""Fixtures of the metric engine's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["scalar", "avx2", "avx512"])
def kernel_isa(request):
    """Runs a test on each instruction-set path of the kernel this CPU has."""
    from rl_gap.metrics.functional import native

    if native.native_library() is None:
        pytest.skip("no C++ toolchain: the engine falls back to the eager path")
    if native.set_isa(request.param) != request.param:
        native.set_isa(None)
        pytest.skip(f"this CPU has no {request.param}")
    yield request.param
    native.set_isa(None)
