"""Negative dropping inside the fast gSAP kernel (issue 12, item 2).

The dropped set is checked against a plain Python sort by (score, flat index)
and against ``drop_lowest_negatives`` (the exact path); the kernel's value and
gradient with dropping against a float64 brute force of the kept list, at the
kernel's stated tolerance (``gsap_contract``).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from gsap_contract import assert_within_contract, reference

from rl_gap.losses import build_loss
from rl_gap.losses.common import drop_lowest_negatives
from rl_gap.losses.fast_sap import binning as fast_binning
from rl_gap.losses.fast_sap import drop as fast_drop
from rl_gap.losses.fast_sap import native as fast_native
from rl_gap.losses.fast_sap.kernel import smoothed_ap_fast

ALPHAS = [0.5, 0.9, 0.95, 0.99]


def sorted_keep(scores: torch.Tensor, positive: torch.Tensor, valid: torch.Tensor, alpha: float):
    """Keep mask by the stated rule, with a Python sort: drop the first floor(α N) valid
    negatives in ascending (score, flat index) order (-0.0 and 0.0 compare equal)."""
    values = scores.double().tolist()
    negatives = [j for j in range(len(values)) if valid[j] and not positive[j]]
    count = math.floor(len(negatives) * alpha + 1e-9)
    keep = valid.clone()
    keep[sorted(negatives, key=lambda j: (values[j], j))[:count]] = False
    return keep


def flat_list(n: int, kind: str, seed: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, generator=gen) * 0.1
    if kind == "ties":  # many exact ties, also across positives and negatives
        scores = torch.round(scores * 32) / 32
    elif kind == "zeros":  # only signed zeros and one other value: a tie at the threshold
        sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
        scores = torch.where(torch.rand(n, generator=gen) < 0.8, 0.0 * sign, sign * 0.25)
    positive = torch.rand(n, generator=gen) < 0.05
    valid = torch.rand(n, generator=gen) < 0.85
    return scores.to(dtype), positive, valid


@pytest.fixture(params=["native", "torch"])
def passes(request, monkeypatch):
    if request.param == "native" and fast_native.native_library() is None:
        pytest.skip("no C++ compiler: the optional native passes are unavailable")
    monkeypatch.setattr(fast_binning, "USE_NATIVE", request.param == "native")
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kind", ["continuous", "ties", "zeros"])
def test_drop_mask_is_the_sorted_selection(passes, dtype, kind):
    for seed, n in enumerate([1, 7, 100, 5003]):
        scores, positive, valid = flat_list(n, kind, seed, dtype)
        for alpha in [0.0, 0.3, *ALPHAS]:
            expected = sorted_keep(scores, positive, valid, alpha)
            assert torch.equal(fast_drop.drop_mask(scores, positive, valid, alpha), expected)
            all_valid = torch.ones_like(valid)
            expected = sorted_keep(scores, positive, all_valid, alpha)
            assert torch.equal(fast_drop.drop_mask(scores, positive, None, alpha), expected)


@pytest.mark.parametrize("kind", ["continuous", "ties", "zeros"])
def test_drop_mask_equals_exact_path_selection(passes, kind):
    # The exact path drops from the compacted list scores[valid]; the kernel keeps the
    # flat layout and marks the same items.
    scores, positive, valid = flat_list(20_000, kind, seed=3)
    for alpha in ALPHAS:
        keep_sub = drop_lowest_negatives(
            scores[valid][None],
            positive[valid][None],
            torch.ones_like(positive[valid])[None],
            alpha,
        )[0]
        expected = torch.zeros_like(valid)
        expected[valid.nonzero().squeeze(1)[keep_sub]] = True
        assert torch.equal(fast_drop.drop_mask(scores, positive, valid, alpha), expected)


def test_drop_mask_many_ties_at_threshold_spread_over_threads(monkeypatch):
    # More tied negatives at the threshold than the native pass records per thread:
    # the rescan branch must drop exactly the first ones in flat order.
    if fast_native.native_library() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setattr(fast_binning, "USE_NATIVE", True)
    n = 50_000
    scores = torch.zeros(n)
    scores[::7] = 1.0
    positive = torch.zeros(n, dtype=torch.bool)
    positive[::101] = True
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for alpha in (0.1, 0.5, 0.99):
            expected = sorted_keep(scores, positive, torch.ones_like(positive), alpha)
            assert torch.equal(fast_drop.drop_mask(scores, positive, None, alpha), expected)
    finally:
        torch.set_num_threads(threads)


def test_bad_neg_drop_rejected():
    scores, positive = torch.zeros(4), torch.ones(4, dtype=torch.bool)
    for bad in (-0.1, 1.0, math.nan):
        with pytest.raises(ValueError, match="neg_drop"):
            smoothed_ap_fast(scores, positive, 0.1, neg_drop=bad)


def square_batch(batch: int, seed: int, kind: str = "random"):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(batch) // 4
    emb = F.normalize(torch.randn(batch, 32, generator=gen), dim=1)
    sim = emb @ emb.T
    if kind == "ties":
        sim = torch.round(sim * 16) / 16
    return sim, labels[:, None] == labels[None, :], ~torch.eye(batch, dtype=torch.bool)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("tau", [1e-1, 1e-2, 1e-4])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fast_kernel_with_dropping_within_contract(passes, alpha, tau, dtype):
    sim, rel, valid = square_batch(96, seed=int(alpha * 100))
    scores, positive, valid = sim.reshape(-1).to(dtype), rel.reshape(-1), valid.reshape(-1)
    keep = sorted_keep(scores, positive, valid, alpha)
    ref = reference(scores[keep], positive[keep], tau)
    s = scores.clone().requires_grad_()
    value = smoothed_ap_fast(s, positive, tau, valid=valid, neg_drop=alpha)
    value.backward()
    assert torch.all(s.grad[~keep] == 0)  # dropped and invalid items: no gradient
    assert_within_contract(value.detach(), s.grad[keep], ref, 1e-8, dtype)


@pytest.mark.parametrize("kind", ["random", "ties"])
def test_gsap_loss_fast_and_auto_match_exact_with_dropping(kind, monkeypatch):
    sim, rel, valid = square_batch(64, seed=5, kind=kind)
    sim = sim.double()
    results = {}
    for impl in ("exact", "fast", "auto"):
        x = sim.clone().requires_grad_()
        loss = build_loss("gsap", temperature=0.01, neg_drop=0.95, impl=impl)(x, rel, valid)
        loss.backward()
        results[impl] = float(loss.detach()), x.grad
    keep = sorted_keep(sim.reshape(-1), rel.reshape(-1), valid.reshape(-1), 0.95)
    ref_value, ref_grad, size, trunc = reference(sim.reshape(-1)[keep], rel.reshape(-1)[keep], 0.01)
    # loss = 1 − SAP: the gradient flips sign.
    ref = (1.0 - ref_value, -ref_grad, size, trunc)
    for impl in ("exact", "fast", "auto"):
        value, grad = results[impl]
        assert torch.all(grad.reshape(-1)[~keep] == 0)
        assert_within_contract(
            torch.tensor(value, dtype=torch.float64), grad.reshape(-1)[keep], ref, 1e-8
        )


def test_auto_with_dropping_runs_the_fast_kernel(monkeypatch):
    from rl_gap.losses.fast_sap import kernel

    calls = []
    real = kernel.smoothed_ap_fast

    def spy(*args, **kwargs):
        calls.append(kwargs.get("neg_drop"))
        return real(*args, **kwargs)

    monkeypatch.setattr(kernel, "smoothed_ap_fast", spy)
    monkeypatch.setattr(kernel, "FAST_MIN_COMPARISONS", 0)
    sim, rel, valid = square_batch(32, seed=6)
    build_loss("gsap", temperature=0.01, neg_drop=0.9, impl="auto")(sim, rel, valid)
    assert calls == [0.9]


def test_dropping_under_bf16_autocast_ranks_float32_similarities():
    # Embeddings multiplied under bf16 autocast; the loss must rank what it is given
    # (the module casts to float32) and select the dropped set on those values.
    gen = torch.Generator().manual_seed(7)
    emb = F.normalize(torch.randn(64, 32, generator=gen), dim=1)
    labels = torch.arange(64) // 4
    rel, valid = labels[:, None] == labels[None, :], ~torch.eye(64, dtype=torch.bool)
    loss_fn = build_loss("gsap", temperature=0.05, neg_drop=0.9, impl="fast")
    leaf = emb.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sim = leaf @ leaf.T
        loss = loss_fn(sim, rel, valid)
    loss.backward()
    ref_sim = sim.detach().double()  # what the loss saw, in float64
    keep = sorted_keep(ref_sim.reshape(-1), rel.reshape(-1), valid.reshape(-1), 0.9)
    ref_value, *_ = reference(ref_sim.reshape(-1)[keep], rel.reshape(-1)[keep], 0.05)
    assert loss.dtype == torch.float32
    assert (
        abs(float(loss.detach()) - (1.0 - ref_value)) <= 1e-8 + 4 * torch.finfo(torch.float32).eps
    )
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()
