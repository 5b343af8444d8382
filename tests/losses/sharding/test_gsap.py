"""gSAP over a sharded list (rl_gap/losses/sharding/gsap.py) on one gloo rank: the exact
sweep against the brute-force float64 smoothed AP, the fast kernel within its tolerance,
and the plan read off the global statistics against ``plan_grid`` of the list itself."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from rl_gap.losses.fast_sap.grid import plan_grid
from rl_gap.losses.sharding import gsap as sharded_gsap

from ..sap_refs import brute_smoothed_ap


def flat_list(n: int = 300, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(n, generator=gen, dtype=torch.float64) * 2 - 1
    positive = torch.rand(n, generator=gen) < 0.1
    positive[0] = True
    return scores, positive


def brute_value_and_grad(scores, positive, tau):
    leaf = scores.clone().requires_grad_(True)
    value = brute_smoothed_ap(leaf, positive.tolist(), tau)
    value.backward()
    return value.detach(), leaf.grad


@pytest.mark.parametrize("chunk_size", [None, 7])
def test_exact_sweep_is_the_brute_force_sap(one_rank_group, chunk_size):
    scores, positive = flat_list()
    ref_value, ref_grad = brute_value_and_grad(scores, positive, 0.05)
    leaf = scores.clone().requires_grad_(True)
    value = sharded_gsap.sharded_smoothed_ap_exact(leaf, positive, 0.05, chunk_size)
    value.backward()
    torch.testing.assert_close(value.detach(), ref_value, rtol=0, atol=1e-12)
    torch.testing.assert_close(leaf.grad, ref_grad, rtol=0, atol=1e-12)


def test_fast_kernel_within_its_tolerance(one_rank_group):
    scores, positive = flat_list(2000, seed=1)
    ref_value, ref_grad = brute_value_and_grad(scores, positive, 0.05)
    leaf = scores.clone().requires_grad_(True)
    value = sharded_gsap.sharded_smoothed_ap_fast(leaf, positive, 0.05, tolerance=1e-8)
    value.backward()
    assert abs(float(value.detach()) - float(ref_value)) <= 1e-8
    assert float((leaf.grad - ref_grad).abs().max()) <= 1e-6 * float(ref_grad.abs().max())


def test_plan_is_the_plan_of_the_list(one_rank_group):
    scores, positive = flat_list()
    valid = torch.ones_like(positive)
    stats = sharded_gsap._global_stats(scores, valid, scores[positive])
    pos = scores[positive]
    assert (stats["num_items"], stats["num_pos"]) == (scores.numel(), pos.numel())
    assert (stats["lo_all"], stats["hi_all"]) == (float(scores.min()), float(scores.max()))
    plan = sharded_gsap._global_plan(stats, 0.05, 1e-6, scores.dtype)
    expected = plan_grid(
        float(scores.min()), float(scores.max()), float(pos.min()), float(pos.max()),
        scores.numel(), 0.05, 1e-6, scores.dtype, cache_tables=stats["cache"],
    )  # fmt: skip
    assert asdict(plan) == asdict(expected)


@pytest.mark.parametrize(
    ("scores", "positive", "kwargs", "match"),
    [
        (torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool), {}, "1-D"),
        (torch.zeros(4), torch.zeros(3, dtype=torch.bool), {}, "same shape"),
        (torch.zeros(4), torch.zeros(4), {}, "bool"),
        (torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.bool), {}, "floating"),
        (torch.zeros(4), torch.ones(4, dtype=torch.bool), {"temperature": 0.0}, "temperature"),
        (torch.zeros(4), torch.ones(4, dtype=torch.bool), {"tolerance": 0.0}, "tolerance"),
        (torch.zeros(4), torch.ones(4, dtype=torch.bool), {"neg_drop": 1.0}, "neg_drop"),
        (torch.zeros(4), torch.ones(4, dtype=torch.bool), {"valid": torch.ones(4)}, "valid"),
    ],
)
def test_fast_kernel_refuses_what_the_one_process_kernel_refuses(scores, positive, kwargs, match):
    # Refused before any collective: no process group is needed to see the error.
    temperature = kwargs.pop("temperature", 0.05)
    with pytest.raises(ValueError, match=match):
        sharded_gsap.sharded_smoothed_ap_fast(scores, positive, temperature, **kwargs)
