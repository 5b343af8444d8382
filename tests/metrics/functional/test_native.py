"""The fused native counting kernel equals the eager tensor path on every instruction set."""

from __future__ import annotations

import pytest
import torch

from rl_gap.metrics.functional import state_from_scores


@pytest.mark.parametrize("shape", [(300, 500), (37, 13)])
def test_native_kernel_matches_eager_counts(monkeypatch, kernel_isa, shape):
    """The fused CPU kernel (built on first use, ~1 s) == the eager tensor path, on
    every instruction-set path; rows of 500 and 13 scores end in partial vectors."""
    from rl_gap.metrics.functional import counting

    rows, cols = shape
    g = torch.Generator().manual_seed(21)
    uniform = torch.rand(rows, cols, generator=g, dtype=torch.float64)
    cases = {
        "ties": torch.round(uniform * 200) / 200,
        # Skewed scores: most grid values crowd a few cells (the kernel's slow path).
        "crowded": torch.round(uniform**12 * 1e6) / 1e6 - 0.5,
        "cosine-like": torch.randn(rows, cols, generator=g, dtype=torch.float64) * 0.1,
        "huge": torch.randn(rows, cols, generator=g, dtype=torch.float64) * 1e6,
        "tiny": torch.randn(rows, cols, generator=g, dtype=torch.float64) * 1e-30,
    }
    for name, base in cases.items():
        for dtype in (torch.float64, torch.float32):
            scores = base.to(dtype)
            rel = torch.rand(rows, cols, generator=g) < 0.05
            rel[:, :40] |= torch.rand(rows, min(40, cols), generator=g) < 0.8
            rel[:20, :200] |= torch.rand(20, min(200, cols), generator=g) < 0.6  # > 64 own
            valid = torch.rand(rows, cols, generator=g) > 0.1  # ignored pairs: -inf
            group = torch.randint(0, 3, (rows,), generator=g)
            args = (scores, rel, valid, group, 3)
            monkeypatch.setattr(counting, "NATIVE_MIN_PAIRS", 1 << 40)
            eager = state_from_scores(*args, bootstrap_budget=rows * 50)
            plain = state_from_scores(*args)
            monkeypatch.setattr(counting, "NATIVE_MIN_PAIRS", 1)
            monkeypatch.setenv("RL_GAP_NATIVE", "1")
            fused = state_from_scores(*args, bootstrap_budget=rows * 50)
            fused_plain = state_from_scores(*args)  # no bootstrap: own counts on packed scores
            monkeypatch.delenv("RL_GAP_NATIVE")
            for key in ("pos_neg_ge", "grid_neg_ge", "boot_neg_ge"):
                assert torch.equal(getattr(eager, key), getattr(fused, key)), (name, dtype, key)
            for key in ("pos_neg_ge", "grid_neg_ge"):
                assert torch.equal(getattr(plain, key), getattr(fused_plain, key)), (name, dtype)


def test_set_isa_refuses_unknown_paths():
    from rl_gap.metrics.functional import native

    if native.native_library() is None:
        pytest.skip("no C++ toolchain")
    with pytest.raises(ValueError, match="isa must be one of"):
        native.set_isa("sse2")
    assert native.set_isa(None) in native.ISA_LEVELS
