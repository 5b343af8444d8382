"""The sub-quadratic smoothed AP (rl_gap.losses.fast_sap.kernel) against brute force in float64."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from gsap_contract import assert_within_contract, reference

from rl_gap.losses import build_loss
from rl_gap.losses.common import drop_lowest_negatives
from rl_gap.losses.fast_sap.kernel import prefer_fast, smoothed_ap_fast
from rl_gap.losses.smoothed_ap import smoothed_ap_exact

TAUS = [1e-1, 1e-2, 1e-3, 1e-4]


def brute_force_sap(scores: torch.Tensor, positive: torch.Tensor, tau: float):
    """docs/definitions.md smoothed AP, written plainly in float64; returns (value, gradient)."""
    s = scores.detach().to(torch.float64).requires_grad_()
    pos_scores = s[positive]
    sig = torch.sigmoid((s.unsqueeze(0) - pos_scores.unsqueeze(1)) / tau)  # (P, M)
    self_mask = torch.zeros_like(sig, dtype=torch.bool)
    self_mask[torch.arange(len(pos_scores)), positive.nonzero().squeeze(1)] = True
    sig = sig.masked_fill(self_mask, 0.0)
    rank_pos = 1.0 + (sig * positive.to(torch.float64)).sum(1)
    rank_all = 1.0 + sig.sum(1)
    sap = (rank_pos / rank_all).mean()
    (grad,) = torch.autograd.grad(sap, s)
    return sap.detach(), grad


def exact_reference(scores, positive, tau):
    """The exact chunked sweep (an independent implementation) in float64."""
    s = scores.detach().to(torch.float64).requires_grad_()
    sap = smoothed_ap_exact(s, positive, tau)
    (grad,) = torch.autograd.grad(sap, s)
    return sap.detach(), grad


def fast_value_and_grad(scores, positive, tau, **kwargs):
    s = scores.detach().clone().requires_grad_()
    sap = smoothed_ap_fast(s, positive, tau, **kwargs)
    (grad,) = torch.autograd.grad(sap, s)
    return sap.detach(), grad


def assert_gradients_match(grad, ref):
    grad, ref = grad.to(torch.float64), ref.to(torch.float64)
    cosine = F.cosine_similarity(grad, ref, dim=0)
    assert cosine >= 0.99999, f"gradient cosine {cosine}"
    big = ref.abs() > 1e-6 * ref.abs().max()
    rel = ((grad - ref).abs()[big] / ref.abs()[big]).max()
    assert rel <= 1e-3, f"max relative gradient error {rel}"


def square_batch(batch: int, kind: str, seed: int = 0, per_class: int = 4):
    """Flattened off-diagonal scores and relevance of a square batch.

    kind: "random" (random unit embeddings), "trained" (tight clusters, hard negatives),
    "ties" (random scores rounded to 1/16, so many exact ties across labels).
    """
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(batch) // per_class
    if kind == "trained":
        # Tight clusters around one direction: all scores within ~0.02, positives
        # mostly above negatives with a small overlap (hard negatives).
        base = torch.randn(1, 32, generator=gen)
        centres = F.normalize(base + 0.08 * torch.randn(batch // per_class + 1, 32, generator=gen))
        emb = centres[labels] + 0.01 * torch.randn(batch, 32, generator=gen)
    else:
        emb = torch.randn(batch, 32, generator=gen)
    emb = F.normalize(emb, dim=1)
    sim = emb @ emb.T
    if kind == "ties":
        sim = torch.round(sim * 16) / 16
    valid = ~torch.eye(batch, dtype=torch.bool)
    rel = labels[:, None] == labels[None, :]
    return sim[valid].contiguous(), rel[valid].contiguous()


@pytest.mark.parametrize("tau", TAUS)
@pytest.mark.parametrize("kind", ["random", "trained", "ties"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_brute_force(tau, kind, dtype):
    # At the stated tolerance (gsap_contract), not a loose 1e-6 / 1e-3.
    scores, positive = square_batch(96, kind, seed=1)
    scores = scores.to(dtype)
    value, grad = fast_value_and_grad(scores, positive, tau)
    assert_within_contract(value, grad, reference(scores, positive, tau), 1e-8, dtype)


@pytest.mark.parametrize("tau", TAUS)
def test_float64_batch_128_matches_exact_sweep(tau):
    scores, positive = square_batch(128, "random", seed=2)
    scores = scores.double()
    ref_value, ref_grad = exact_reference(scores, positive, tau)
    value, grad = fast_value_and_grad(scores, positive, tau)
    assert value.dtype == torch.float64 and grad.dtype == torch.float64
    # The exact sweep (another implementation) agrees with the brute force ...
    ref = reference(scores, positive, tau)
    assert abs(float(ref_value) - ref[0]) <= 1e-13
    assert torch.allclose(ref_grad, ref[1], rtol=0, atol=1e-12 * float(ref[2].max()))
    # ... and the fast kernel is within the stated tolerance of both.
    assert_within_contract(value, grad, ref, 1e-8)


@pytest.mark.slow
@pytest.mark.parametrize("tau", TAUS)
@pytest.mark.parametrize("kind", ["random", "trained"])
def test_batch_1024_matches_exact_sweep(tau, kind):
    scores, positive = square_batch(1024, kind, seed=3)
    ref_value, ref_grad = exact_reference(scores, positive, tau)
    value, grad = fast_value_and_grad(scores, positive, tau)
    # Value at the stated tolerance (plus the float32 output's rounding); no float64
    # brute force of the gradient terms at this size, so gradients by cosine/relative error.
    assert abs(float(value) - float(ref_value)) <= (
        1e-8 + 4 * torch.finfo(torch.float32).eps
    ) * float(ref_value)
    assert_gradients_match(grad, ref_grad)


def test_tolerance_is_honoured_in_float64():
    gen = torch.Generator().manual_seed(4)
    scores = torch.randn(3000, generator=gen, dtype=torch.float64) * 0.02
    positive = torch.rand(3000, generator=gen) < 0.05
    ref = reference(scores, positive, 1e-3)
    for tolerance in (1e-4, 1e-7, 1e-10):
        value, grad = fast_value_and_grad(scores, positive, 1e-3, tolerance=tolerance)
        assert_within_contract(value, grad, ref, tolerance)


def test_many_positives_per_row_and_isolated_items():
    # Half the items positive, plus far outliers above and below every positive
    # (they fall outside the grid window and are counted / ignored).
    gen = torch.Generator().manual_seed(5)
    scores = torch.cat([torch.rand(2000, generator=gen) * 0.1, torch.tensor([5.0, -5.0, 3.0])])
    positive = torch.zeros(scores.numel(), dtype=torch.bool)
    positive[:1000] = True
    for tau in (1e-2, 1e-4):
        value, grad = fast_value_and_grad(scores, positive, tau)
        assert_within_contract(value, grad, reference(scores, positive, tau), 1e-8, torch.float32)


def test_real_scatter_path_matches(monkeypatch):
    # The per-moment float64 scatter used on accelerators without complex atomics.
    from rl_gap.losses.fast_sap import binning as fast_binning

    scores, positive = square_batch(64, "random", seed=10)
    expected, expected_grad = fast_value_and_grad(scores, positive, 1e-2)
    monkeypatch.setattr(fast_binning, "PAIRED_SCATTER_DEVICES", ())
    value, grad = fast_value_and_grad(scores, positive, 1e-2)
    assert_within_contract(value, grad, reference(scores, positive, 1e-2), 1e-8, torch.float32)
    assert abs(float(value) - float(expected)) <= 1e-7


def test_single_positive_and_all_equal_scores():
    scores = torch.zeros(50)
    positive = torch.zeros(50, dtype=torch.bool)
    positive[7] = True
    value, grad = fast_value_and_grad(scores, positive, 0.01)
    # R_P = 1, R_A = 1 + 49/2.
    assert abs(float(value) - 1.0 / 25.5) <= 1e-7
    ref_value, ref_grad = brute_force_sap(scores, positive, 0.01)
    assert torch.allclose(grad.double(), ref_grad, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype):
    scores, positive = square_batch(48, "random", seed=6)
    scores = scores.to(dtype)
    ref_value, ref_grad = brute_force_sap(scores.float(), positive, 0.05)
    s = scores.clone().requires_grad_()
    value = smoothed_ap_fast(s, positive, 0.05)
    value.backward()
    value = value.detach()
    assert value.dtype == torch.float32
    assert s.grad.dtype == dtype
    assert abs(float(value) - float(ref_value)) <= 1e-6
    assert F.cosine_similarity(s.grad.double(), ref_grad, dim=0) > 0.999


def test_gsap_loss_fast_matches_exact_with_valid_mask_and_neg_drop():
    gen = torch.Generator().manual_seed(7)
    sim = torch.randn(40, 60, generator=gen) * 0.1
    rel = torch.rand(40, 60, generator=gen) < 0.05
    valid = torch.rand(40, 60, generator=gen) < 0.9
    for neg_drop in (0.0, 0.5):
        losses = {}
        grads = {}
        for impl in ("exact", "fast"):
            x = sim.clone().double().requires_grad_()
            loss = build_loss("gsap", temperature=0.01, neg_drop=neg_drop, impl=impl)(x, rel, valid)
            loss.backward()
            losses[impl], grads[impl] = float(loss.detach()), x.grad
        assert abs(losses["fast"] - losses["exact"]) <= 1e-8
        # The loss ranks the row-major list sim[valid] as one list (drops on that list).
        flat, positive = sim.double()[valid], rel[valid]
        keep = drop_lowest_negatives(
            flat[None], positive[None], torch.ones_like(positive)[None], neg_drop
        )[0]
        ref_value, ref_grad, size, trunc = reference(flat[keep], positive[keep], 0.01)
        ref = (1.0 - ref_value, -ref_grad, size, trunc)  # loss = 1 − SAP
        for impl in ("exact", "fast"):
            assert_within_contract(
                torch.tensor(losses[impl], dtype=torch.float64), grads[impl][valid][keep], ref, 1e-8
            )


def test_valid_mask_equals_dropping_the_items():
    gen = torch.Generator().manual_seed(9)
    scores = torch.randn(4000, generator=gen) * 0.05
    positive = torch.rand(4000, generator=gen) < 0.04
    valid = torch.rand(4000, generator=gen) < 0.8
    scores[~valid] = 1.0  # invalid items would dominate the ranking if they counted
    ref = reference(scores[valid], positive[valid], 1e-3)
    s = scores.clone().requires_grad_()
    value = smoothed_ap_fast(s, positive, 1e-3, valid=valid)
    value.backward()
    assert torch.all(s.grad[~valid] == 0)
    assert_within_contract(value, s.grad[valid], ref, 1e-8, torch.float32)


def test_prefer_fast_switches_with_size():
    assert not prefer_fast(3, 100, 0.01)
    assert prefer_fast(3 * 2048, 2048 * 2047, 0.01)
    assert isinstance(prefer_fast(100, 10_000, 1e-4), bool)


@pytest.mark.parametrize(
    ("scores", "positive", "tau", "tolerance", "match"),
    [
        (torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool), 0.1, 1e-7, "1-D"),
        (torch.zeros(4), torch.zeros(3, dtype=torch.bool), 0.1, 1e-7, "same shape"),
        (torch.zeros(4), torch.zeros(4), 0.1, 1e-7, "bool"),
        (torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.bool), 0.1, 1e-7, "floating"),
        (torch.zeros(4), torch.zeros(4, dtype=torch.bool), 0.1, 1e-7, "positive"),
        (torch.tensor([0.0, math.nan]), torch.ones(2, dtype=torch.bool), 0.1, 1e-7, "NaN"),
        (torch.zeros(4), torch.ones(4, dtype=torch.bool), 0.0, 1e-7, "temperature"),
        (torch.zeros(4), torch.ones(4, dtype=torch.bool), 0.1, 0.0, "tolerance"),
    ],
)
def test_bad_input_raises(scores, positive, tau, tolerance, match):
    with pytest.raises(ValueError, match=match):
        smoothed_ap_fast(scores, positive, tau, tolerance=tolerance)


@pytest.mark.parametrize("seed", [1, 3, 12])
def test_tight_clusters_with_mask_at_smallest_tau(seed):
    # A positive's own gradient is a difference of near-equal kernel sums here: the
    # default tolerance must keep it within the contract (1e-7 gave 2.5e-3).
    scores, positive = square_batch(96, "trained", seed=seed)
    valid = torch.rand(scores.numel(), generator=torch.Generator().manual_seed(13)) < 0.95
    ref = reference(scores[valid], positive[valid], 1e-4)
    s = scores.clone().requires_grad_()
    value = smoothed_ap_fast(s, positive, 1e-4, valid=valid)
    value.backward()
    assert_within_contract(value, s.grad[valid], ref, 1e-8, torch.float32)


@pytest.mark.parametrize("tau", [1e-1, 1e-4])
def test_torch_passes_match_brute_force(monkeypatch, tau):
    # The pure-torch passes (CUDA, or CPU without a compiler) against the reference.
    from rl_gap.losses.fast_sap import binning as fast_binning

    monkeypatch.setattr(fast_binning, "USE_NATIVE", False)
    scores, positive = square_batch(96, "random", seed=12)
    valid = torch.rand(scores.numel(), generator=torch.Generator().manual_seed(13)) < 0.95
    ref = reference(scores[valid], positive[valid], tau)
    s = scores.clone().requires_grad_()
    value = smoothed_ap_fast(s, positive, tau, valid=valid)
    value.backward()
    assert_within_contract(value, s.grad[valid], ref, 1e-8, torch.float32)
