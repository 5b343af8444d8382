"""The fast gSAP kernel's torch (GPU) passes: compacted binning, radix-select dropping, chunks.

References are independent: moments and polynomials by a float64 loop over the items from
the binning formula, the dropped set by a Python sort (``test_gsap_neg_drop.sorted_keep``)
and by the exact path's ``drop_lowest_negatives``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from rl_gap.losses.common import drop_lowest_negatives
from rl_gap.losses.fast_sap import binning as fast_binning
from rl_gap.losses.fast_sap import drop as fast_drop
from rl_gap.losses.fast_sap import kernel as fast_rank
from rl_gap.losses.fast_sap.grid import plan_grid
from tests.losses.fast_sap.test_neg_drop import flat_list, sorted_keep


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


def test_chunk_sizes_per_device(fake_cuda):
    assert fast_binning.chunk_elements(torch.device("cpu")) == fast_binning.CHUNK_ELEMENTS
    assert fast_binning.chunk_elements(fake_cuda.device) > fast_binning.CHUNK_ELEMENTS
    p, m = 3 * 512, 512 * 511  # a B = 512 batch, 4 per class: fast on the CPU, exact on a GPU
    assert fast_rank.prefer_fast(p, m, 0.01)
    assert not fast_rank.prefer_fast(p, m, 0.01, device="cuda")
    assert fast_rank.prefer_fast(3 * 4096, 4096 * 4095, 0.01, device="cuda")


def test_order_keys_preserve_float_order():
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x = torch.cat(
            [
                torch.randn(2000, generator=gen)
                * 10.0 ** torch.randint(-40, 30, (2000,), generator=gen),
                torch.tensor([0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38]),
            ]
        ).to(dtype)
        keys, _ = fast_drop.order_keys(x)
        values = x.tolist()
        ref = sorted(range(len(values)), key=lambda j: (values[j], j))
        assert torch.argsort(keys, stable=True).tolist() == ref
        zero = keys[(x == 0)]
        assert bool((zero == 0).all())  # -0.0 and +0.0 tie, as in the sort


@pytest.mark.parametrize("kind", ["continuous", "ties", "zeros"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_drop_mask_without_sort_or_kthvalue(monkeypatch, kind, dtype):
    monkeypatch.setattr(fast_binning, "USE_NATIVE", False)
    for name in ("kthvalue", "sort", "argsort", "topk"):
        monkeypatch.setattr(torch, name, lambda *a, _n=name, **k: pytest.fail(f"torch.{_n}"))
    for seed, n in enumerate([5, 333, 20_000]):
        scores, positive, valid = flat_list(n, kind, seed, dtype)
        for alpha in (0.3, 0.9, 0.95):
            expected = sorted_keep(scores, positive, valid, alpha)
            assert torch.equal(fast_drop.drop_mask(scores, positive, valid, alpha), expected)
            expected = sorted_keep(scores, positive, torch.ones_like(valid), alpha)
            assert torch.equal(fast_drop.drop_mask(scores, positive, None, alpha), expected)


@pytest.mark.parametrize("kind", ["continuous", "ties", "zeros"])
def test_drop_mask_on_cuda_equals_exact_path(fake_cuda, kind):
    scores, positive, valid = flat_list(20_000, kind, seed=3)
    for alpha in (0.5, 0.9, 0.95):
        keep_sub = drop_lowest_negatives(
            scores[valid][None],
            positive[valid][None],
            torch.ones_like(positive[valid])[None],
            alpha,
        )[0]
        expected = torch.zeros_like(valid)
        expected[valid.nonzero().squeeze(1)[keep_sub]] = True
        keep = fast_drop.drop_mask(scores.to("cuda"), positive.to("cuda"), valid.to("cuda"), alpha)
        assert keep.is_cuda
        assert torch.equal(keep.cpu(), expected)
