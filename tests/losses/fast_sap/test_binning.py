"""The fast gSAP kernel's binning (rl_gap/losses/fast_sap/binning.py): moments and polynomials
against a float64 loop over the items from the binning formula; only kept items are binned."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from rl_gap.losses.fast_sap import binning as fast_binning
from rl_gap.losses.fast_sap.grid import plan_grid


class ScatterSizes(TorchFunctionMode):
    """Counts the items every scatter/gather-by-row of the passes touches."""

    def __init__(self) -> None:
        super().__init__()
        self.scattered = 0
        self.evaluated = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.scatter_add_, torch.Tensor.index_add_):
            self.scattered += args[2].numel()
        if func is torch.Tensor.index_copy_:
            self.evaluated += args[2].numel()
        return func(*args, **kwargs)


def binning_reference(scores, plan, valid):
    """(row, t) per item by the module's formula (row 0: sink); t = (s − centre) / h_f is
    rounded in the scores' dtype, as the kernel's (exact only within a factor 2 of s)."""
    h = plan.h_fine
    s = scores.double().numpy()
    cell = np.clip(np.floor(s / h - plan.lo / h), -1, plan.num_fine)
    cell[~valid.numpy()] = -1
    centre = torch.from_numpy(cell * h + plan.lo + 0.5 * h).to(scores.dtype)
    t = ((scores - centre) / h).clamp(-1.0, 1.0).double().numpy()
    return (cell + 1).astype(np.int64), t


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_moments_bin_only_kept_items(monkeypatch, dtype):
    monkeypatch.setattr(fast_binning, "USE_NATIVE", False)
    gen = torch.Generator().manual_seed(5)
    scores = (torch.randn(30_000, generator=gen) * 0.2).to(dtype)
    scores[:4] = torch.tensor([5.0, -5.0, 0.3, 0.29])
    valid = torch.rand(30_000, generator=gen) < 0.7
    plan = plan_grid(-0.1, 0.3, -0.05, 0.25, scores.numel(), 0.01, 1e-7, dtype)
    row, t = binning_reference(scores, plan, valid)
    order = plan.fine_order
    ref = np.zeros((plan.num_fine + 2, order + 1))
    for k in range(order + 1):
        np.add.at(ref[:, k], row, t**k)
    ref[0] = 0.0
    sizes = ScatterSizes()
    with sizes:
        moments = fast_binning.fine_moments(scores, plan, valid)
    np.testing.assert_allclose(moments.numpy(), ref, rtol=1e-12, atol=1e-9)
    kept = int((row != 0).sum())
    assert kept < 0.6 * scores.numel()  # most items are below the window or invalid
    pairs = (order + 2) // 2
    assert sizes.scattered == pairs * kept  # one complex add per kept item and table

    table = torch.randn(plan.num_fine + 2, order + 1, dtype=torch.float64, generator=gen)
    table[0] = table[-1] = 0.0
    table[5] = 0.0  # an empty row: its items are not evaluated either
    values = torch.full_like(scores, math.nan)
    with sizes:
        fast_binning.evaluate_fine(scores, plan, table, values, valid)
    coef = table.numpy()[row]
    expected = sum(coef[:, k] * t**k for k in range(order + 1))
    eps = torch.finfo(dtype).eps
    np.testing.assert_allclose(values.double().numpy(), expected, rtol=8 * eps, atol=8 * eps)
    assert sizes.evaluated == int(((row != 0) & (row != plan.num_fine + 1) & (row != 5)).sum())
