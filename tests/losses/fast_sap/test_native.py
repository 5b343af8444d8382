"""The optional C++ passes of the fast gSAP kernel (rl_gap/losses/fast_sap/native.py) against
the torch passes and against ``nonzero``; skipped where no compiler exists."""

from __future__ import annotations

import pytest
import torch

TAUS = [1e-1, 1e-2, 1e-3, 1e-4]


def _native_or_skip():
    from rl_gap.losses.fast_sap import native as fast_native

    if fast_native.native_library() is None:
        pytest.skip("no C++ compiler: the optional native passes are unavailable")
    return fast_native


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tau", TAUS)
def test_native_passes_match_torch_passes(monkeypatch, dtype, tau):
    # The optional C++ passes against the torch passes on the same plan: moment
    # sums to float64 rounding (summation order differs), polynomials to 1 ulp.
    _native_or_skip()
    from rl_gap.losses.fast_sap import binning as fast_binning
    from rl_gap.losses.fast_sap.grid import plan_grid

    gen = torch.Generator().manual_seed(11)
    scores = (torch.randn(50_000, generator=gen) * 0.1).to(dtype)
    scores[:3] = torch.tensor([4.0, -4.0, 0.7])  # outside the window: sink rows
    valid = torch.rand(50_000, generator=gen) < 0.9
    plan = plan_grid(-0.3, 0.3, -0.2, 0.2, scores.numel(), tau, 1e-7, dtype)
    table = torch.randn(plan.num_fine + 2, plan.fine_order + 1, dtype=torch.float64)
    table[0] = table[-1] = 0.0
    results = {}
    for native in (True, False):
        monkeypatch.setattr(fast_binning, "USE_NATIVE", native)
        moments = fast_binning.fine_moments(scores, plan, valid)
        values = fast_binning.evaluate_fine(scores, plan, table, torch.empty_like(scores), valid)
        results[native] = moments, values
    (m_nat, v_nat), (m_ref, v_ref) = results[True], results[False]
    scale = m_ref.abs().amax(0).clamp_min(1e-300)
    assert ((m_nat - m_ref).abs() / scale).max() <= 1e-12
    assert torch.equal(m_nat[:, 0], m_ref[:, 0])  # counts are exact
    ulp = torch.finfo(dtype).eps * v_ref.abs().clamp_min(1.0)
    assert ((v_nat - v_ref).abs() <= 4 * ulp).all()
    assert torch.all(v_nat[~valid] == 0)


def test_native_select_matches_nonzero():
    fast_native = _native_or_skip()
    gen = torch.Generator().manual_seed(14)
    for n in (0, 5, 8, 1003):
        positive = torch.rand(n, generator=gen) < 0.1
        valid = torch.rand(n, generator=gen) < 0.7
        expected = (positive & valid).nonzero().squeeze(1)
        assert torch.equal(fast_native.select(positive, valid), expected)
        assert torch.equal(fast_native.select(positive, None), positive.nonzero().squeeze(1))
