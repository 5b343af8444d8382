"""gSAP and mSAP against a brute-force float64 smoothed AP written plainly here.

The reference materialises the full P × M comparison matrix with explicit
broadcasting, and applies negative dropping with its own rule: keep every
positive; among the negatives, sort by (score, flat position) ascending with
Python's ``sorted`` and drop the first ``floor(α · N)`` (α · N rounded at 1e-9
first), i.e. ties between equal negatives drop the earlier position first.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rl_gap.losses import build_loss, smoothed_ap_exact

TEMPERATURES = [1e-1, 1e-2, 1e-3]


def brute_smoothed_ap(scores: torch.Tensor, positive: list[bool], tau: float) -> torch.Tensor:
    """SAP of one list, full P × M broadcast (float64, autograd for gradients)."""
    pos_mask = torch.tensor(positive)
    pos_idx = [i for i, p in enumerate(positive) if p]
    anchors = scores[pos_idx]
    sig = torch.sigmoid((scores.unsqueeze(0) - anchors.unsqueeze(1)) / tau)  # (P, M)
    columns = torch.arange(len(positive))
    not_self = columns.unsqueeze(0) != torch.tensor(pos_idx).unsqueeze(1)
    r_p = 1.0 + (sig * (pos_mask.unsqueeze(0) & not_self)).sum(1)
    r_a = r_p + (sig * ~pos_mask.unsqueeze(0)).sum(1)
    return (r_p / r_a).mean()


def brute_drop(items: list[tuple[int, bool]], values: list[float], alpha: float) -> list[int]:
    """Keep-list of positions after dropping the floor(α·N) lowest negatives."""
    negatives = [i for i, is_pos in items if not is_pos]
    n_drop = math.floor(alpha * len(negatives) + 1e-9)
    dropped = set(sorted(negatives, key=lambda i: (values[i], i))[:n_drop])
    return [i for i, _ in items if i not in dropped]


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


def brute_row_sap(sim, rel, valid, tau, alpha):
    """Mean SAP over rows with ≥ 1 valid positive, each row its own list."""
    saps = []
    for q in range(sim.shape[0]):
        cols = [d for d in range(sim.shape[1]) if valid[q, d]]
        pos = [bool(rel[q, d]) for d in cols]
        if not any(pos):
            continue
        values = [float(sim[q, d].detach()) for d in cols]
        keep = brute_drop(list(enumerate(pos)), values, alpha)
        scores = torch.stack([sim[q, cols[i]] for i in keep])
        saps.append(brute_smoothed_ap(scores, [pos[i] for i in keep], tau))
    return torch.stack(saps).mean()


def brute_msap(sim, rel, valid, tau, alpha=0.0, symmetric=False):
    sap = brute_row_sap(sim, rel, valid, tau, alpha)
    if symmetric:
        sap = 0.5 * (sap + brute_row_sap(sim.T, rel.T, valid.T, tau, alpha))
    return 1.0 - sap


def make_batch(seed: int, ties: bool, q: int = 9, d: int = 11):
    """Random sims, several positives per row, a random valid mask, 2 rows without positives."""
    gen = torch.Generator().manual_seed(seed)
    sim = torch.rand(q, d, generator=gen, dtype=torch.float64) * 2 - 1
    if ties:
        sim = torch.round(sim * 5) / 5  # 11 distinct values: many exact ties
    rel = torch.rand(q, d, generator=gen) < 0.3
    rel[0, :3] = True
    rel[-2:] = False  # distractor queries: their pairs are negatives only
    valid = torch.rand(q, d, generator=gen) > 0.15
    valid[0, :3] = True
    return sim, rel, valid


def grad_of(loss_fn, sim, rel, valid):
    leaf = sim.clone().requires_grad_(True)
    loss = loss_fn(leaf, rel, valid)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


def assert_matches(loss_fn, reference_fn, sim, rel, valid):
    loss, grad = grad_of(loss_fn, sim, rel, valid)
    ref_loss, ref_grad = grad_of(reference_fn, sim, rel, valid)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("tau", TEMPERATURES)
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.9])
def test_gsap_matches_brute_force(tau, ties, alpha):
    sim, rel, valid = make_batch(seed=int(tau * 1e4) + 7 * ties, ties=ties)
    loss_fn = build_loss("gsap", temperature=tau, neg_drop=alpha, impl="exact")
    assert_matches(loss_fn, lambda s, r, v: brute_gsap(s, r, v, tau, alpha), sim, rel, valid)


@pytest.mark.parametrize("tau", TEMPERATURES)
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("alpha", [0.0, 0.5])
@pytest.mark.parametrize("symmetric", [False, True])
def test_msap_matches_brute_force(tau, ties, alpha, symmetric):
    sim, rel, valid = make_batch(seed=int(tau * 1e4) + 3 * ties, ties=ties)
    loss_fn = build_loss("msap", temperature=tau, neg_drop=alpha, symmetric=symmetric)
    reference = lambda s, r, v: brute_msap(s, r, v, tau, alpha, symmetric)  # noqa: E731
    assert_matches(loss_fn, reference, sim, rel, valid)


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


@pytest.mark.parametrize("chunk_size", [1, 3])
def test_msap_chunked_matches_brute_force(chunk_size):
    sim, rel, valid = make_batch(seed=5, ties=False)
    loss_fn = build_loss("msap", temperature=0.05, chunk_size=chunk_size)
    assert_matches(loss_fn, lambda s, r, v: brute_msap(s, r, v, 0.05), sim, rel, valid)


def test_smoothed_ap_exact_flat_contract():
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(200, generator=gen, dtype=torch.float64)
    positive = torch.rand(200, generator=gen) < 0.1
    leaf = scores.clone().requires_grad_(True)
    value = smoothed_ap_exact(leaf, positive, 0.02, chunk_size=3)
    ref = brute_smoothed_ap(scores.clone().requires_grad_(True), positive.tolist(), 0.02)
    torch.testing.assert_close(value, ref.detach(), rtol=1e-12, atol=1e-14)
    (2.5 * value).backward()
    ref_leaf = scores.clone().requires_grad_(True)
    (2.5 * brute_smoothed_ap(ref_leaf, positive.tolist(), 0.02)).backward()
    torch.testing.assert_close(leaf.grad, ref_leaf.grad, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="at least one positive"):
        smoothed_ap_exact(scores, torch.zeros(200, dtype=torch.bool), 0.1)


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


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any aten op produces (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def metric_batch(batch: int = 64):
    gen = torch.Generator().manual_seed(9)
    emb = torch.nn.functional.normalize(torch.randn(batch, 8, generator=gen), dim=1)
    labels = torch.arange(batch) // 4
    rel = labels.unsqueeze(1) == labels.unsqueeze(0)
    return emb @ emb.T, rel, ~torch.eye(batch, dtype=torch.bool)


def test_gsap_never_materialises_the_comparison_matrix():
    sim, rel, valid = metric_batch()
    num_items, num_pos = int(valid.sum()), int((rel & valid).sum())  # M = 4032, P = 192
    leaf = sim.clone().requires_grad_(True)
    with LargestTensor() as mode:
        build_loss("gsap", temperature=0.01, impl="exact", chunk_size=4)(
            leaf, rel, valid
        ).backward()
    assert mode.numel <= 4 * num_items < num_pos * num_items // 40


def test_msap_chunks_rows():
    sim, rel, valid = metric_batch()
    leaf = sim.clone().requires_grad_(True)
    with LargestTensor() as mode:
        build_loss("msap", temperature=0.01, chunk_size=2)(leaf, rel, valid).backward()
    # One-shot Smooth-AP would hold rows × K × D = 64 · 3 · 64 comparisons.
    assert mode.numel <= sim.numel() < 64 * 3 * 64
