"""gSAP (rl_gap/losses/gsap.py) against a brute-force float64 smoothed AP of the flattened
valid pairs (``sap_refs``: the full P × M comparison matrix, negative dropping by a Python
sort), plus the choice of kernel (``impl``) and its checks."""

from __future__ import annotations

import pytest
import torch

import rl_gap.losses.gsap as gsap_module
from rl_gap.losses import build_loss

from .sap_refs import (
    LargestTensor,
    assert_matches,
    brute_drop,
    brute_smoothed_ap,
    grad_of,
    make_batch,
    metric_batch,
)

TEMPERATURES = [1e-1, 1e-2, 1e-3]


def brute_gsap(sim, rel, valid, tau, alpha=0.0):
    flat_scores, flat_pos = [], []
    for q in range(sim.shape[0]):
        for d in range(sim.shape[1]):
            if valid[q, d]:
                flat_scores.append(sim[q, d])
                flat_pos.append(bool(rel[q, d]))
    values = [float(s.detach()) for s in flat_scores]
    keep = brute_drop(list(enumerate(flat_pos)), values, alpha)
    scores = torch.stack([flat_scores[i] for i in keep])
    return 1.0 - brute_smoothed_ap(scores, [flat_pos[i] for i in keep], tau)


@pytest.mark.parametrize("tau", TEMPERATURES)
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.9])
def test_gsap_matches_brute_force(tau, ties, alpha):
    sim, rel, valid = make_batch(seed=int(tau * 1e4) + 7 * ties, ties=ties)
    loss_fn = build_loss("gsap", temperature=tau, neg_drop=alpha, impl="exact")
    assert_matches(loss_fn, lambda s, r, v: brute_gsap(s, r, v, tau, alpha), sim, rel, valid)


def test_gradients_are_informative_at_moderate_temperature():
    """Guard against a trivially-zero gradient passing the comparisons above."""
    sim, rel, valid = make_batch(seed=1, ties=False)
    for name in ("gsap", "msap"):
        _, grad = grad_of(build_loss(name, temperature=0.1), sim, rel, valid)
        assert grad.abs().max() > 1e-3
        assert (grad[~valid] == 0).all()


@pytest.mark.parametrize("chunk_size", [1, 2, 5, 64])
def test_gsap_chunked_equals_unchunked(chunk_size):
    sim, rel, valid = make_batch(seed=11, ties=True, q=14, d=13)
    whole = build_loss("gsap", temperature=0.05, impl="exact", chunk_size=10_000)
    chunked = build_loss("gsap", temperature=0.05, impl="exact", chunk_size=chunk_size)
    loss_a, grad_a = grad_of(whole, sim, rel, valid)
    loss_b, grad_b = grad_of(chunked, sim, rel, valid)
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad_a, grad_b, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("name", ["gsap", "msap"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32(name, dtype):
    sim, rel, valid = make_batch(seed=2, ties=False)
    sim_half = sim.to(dtype)
    loss_fn = build_loss(name, temperature=0.05)
    leaf = sim_half.clone().requires_grad_(True)
    loss = loss_fn(leaf, rel, valid)
    loss.backward()
    assert loss.dtype == torch.float32 and leaf.grad.dtype == dtype
    reference = loss_fn(sim_half.double(), rel, valid)
    assert abs(float(loss.detach()) - float(reference)) < 1e-5


def test_gsap_never_materialises_the_comparison_matrix():
    sim, rel, valid = metric_batch()
    num_items, num_pos = int(valid.sum()), int((rel & valid).sum())  # M = 4032, P = 192
    leaf = sim.clone().requires_grad_(True)
    with LargestTensor() as mode:
        build_loss("gsap", temperature=0.01, impl="exact", chunk_size=4)(
            leaf, rel, valid
        ).backward()
    assert mode.numel <= 4 * num_items < num_pos * num_items // 40


def small_batch(q: int = 6, d: int = 6):
    gen = torch.Generator().manual_seed(0)
    sim = torch.rand(q, d, generator=gen) * 2 - 1
    labels = torch.arange(q) % 3
    rel = labels.unsqueeze(1) == labels[:d].unsqueeze(0)
    valid = ~torch.eye(q, d, dtype=torch.bool)
    return sim, rel, valid


def test_bad_impl_and_chunk_size():
    with pytest.raises(ValueError, match="unknown gsap impl 'gpu'"):
        build_loss("gsap", impl="gpu")
    with pytest.raises(ValueError, match="chunk_size"):
        build_loss("gsap", chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size"):
        build_loss("msap", chunk_size=-2)


def test_load_fast_kernel_is_the_fast_sap_kernel(monkeypatch):
    from rl_gap.losses.fast_sap import kernel

    assert gsap_module.load_fast_kernel() is kernel.smoothed_ap_fast
    monkeypatch.delattr(kernel, "smoothed_ap_fast")
    assert gsap_module.load_fast_kernel() is None


def test_fast_impl_without_kernel(monkeypatch):
    from rl_gap.losses.fast_sap import kernel

    monkeypatch.delattr(kernel, "smoothed_ap_fast")
    with pytest.raises(ValueError, match="fast_sap.kernel"):
        build_loss("gsap", impl="fast")
    loss_fn = build_loss("gsap", impl="auto")
    assert loss_fn.select_impl(10**6, 10**6) == "exact"


def test_auto_uses_fast_kernel_when_it_prefers(monkeypatch):
    calls = []
    prefer = {"fast": True}

    def fake_fast(scores, positive, temperature, *, tolerance=1e-7, valid=None):
        keep = torch.ones_like(positive) if valid is None else valid
        calls.append((int(keep.sum()), int((positive & keep).sum()), temperature, tolerance))
        return scores.mean() * 0 + 0.25

    from rl_gap.losses.fast_sap import kernel

    monkeypatch.setattr(kernel, "smoothed_ap_fast", fake_fast)
    monkeypatch.setattr(kernel, "prefer_fast", lambda p, m, t, device=None: prefer["fast"])
    sim, rel, valid = small_batch()
    loss = build_loss("gsap", temperature=0.02, impl="auto", tolerance=1e-5)(sim, rel, valid)
    assert float(loss) == pytest.approx(0.75)
    assert calls == [(int(valid.sum()), int((rel & valid).sum()), 0.02, 1e-5)]
    prefer["fast"] = False
    build_loss("gsap", impl="auto")(sim, rel, valid)
    assert len(calls) == 1  # the kernel declined: exact path
