"""The fast gSAP kernel's torch (GPU) passes: radix-select dropping, chunks.

References are independent: the dropped set by a Python sort (``test_drop.sorted_keep``)
and by the exact path's ``drop_lowest_negatives``.
"""

from __future__ import annotations

import pytest
import torch

from rl_gap.losses.common import drop_lowest_negatives
from rl_gap.losses.fast_sap import binning as fast_binning
from rl_gap.losses.fast_sap import drop as fast_drop
from rl_gap.losses.fast_sap import kernel as fast_rank
from tests.losses.fast_sap.test_drop import flat_list, sorted_keep


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
