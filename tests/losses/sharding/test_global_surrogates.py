"""gSoftBin, gBlackBox and gSupAP over a sharded list (rl_gap/losses/sharding/global_surrogates.py)
on one gloo rank, against the float64 references of ``tests/surrogate_refs.py``."""

from __future__ import annotations

import pytest
import torch
from surrogate_refs import blackbox_reference, brute_softbin_ap, brute_supap

from rl_gap.losses import softbin
from rl_gap.losses.sharding import global_surrogates


def flat_list(n: int = 80, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    scores = (torch.rand(n, generator=gen, dtype=torch.float64) * 1.8 - 0.9).round(decimals=6)
    positive = torch.rand(n, generator=gen) < 0.25
    positive[:2] = True
    return scores, positive


def value_and_grad(fn, scores, scale=1.0):
    leaf = scores.clone().requires_grad_(True)
    value = fn(leaf)
    (scale * value).backward()
    return value.detach(), leaf.grad


@pytest.mark.parametrize("num_bins", [5, 10])
def test_softbin_is_the_brute_force_histogram_ap(one_rank_group, num_bins):
    scores, positive = flat_list()
    value, grad = value_and_grad(
        lambda s: softbin.sharded_softbin_ap(s, positive, num_bins, (-1.0, 1.0)), scores
    )
    ref, ref_grad = value_and_grad(
        lambda s: brute_softbin_ap(s, positive.tolist(), num_bins), scores
    )
    torch.testing.assert_close(value, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-10)


def test_blackbox_is_the_defining_formula(one_rank_group):
    scores, positive = flat_list(seed=1)
    value, grad = value_and_grad(
        lambda s: global_surrogates.sharded_blackbox_ap(s, positive, 4.0, 0.02), scores, -3.0
    )
    row = torch.ones(1, scores.numel(), dtype=torch.bool)
    ref_loss, ref_grad = blackbox_reference(
        scores[None], positive[None], row, False, 4.0, 0.02, scale=3.0
    )
    assert 1.0 - float(value) == pytest.approx(ref_loss, abs=1e-12)
    torch.testing.assert_close(grad, ref_grad[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("start", [0.5, 0.0])
def test_supap_is_the_paper_rank_form(one_rank_group, start):
    scores, positive = flat_list(seed=2)
    params = (0.01, 100.0, 1.44, 0.05, start)
    value, grad = value_and_grad(
        lambda s: global_surrogates.sharded_supap(s, positive, params, 5), scores
    )
    ref, ref_grad = value_and_grad(lambda s: brute_supap(s, positive.tolist(), *params), scores)
    torch.testing.assert_close(value, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-10)
