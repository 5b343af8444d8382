"""The shared pieces of rl_gap/losses/common.py: input checks and the zero loss (through the
losses that use them), negative dropping against a Python sort, ``num_dropped``'s rounding,
and ``sweep_with_gradient`` against autograd of a hand-written function."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from rl_gap.losses import build_loss
from rl_gap.losses.common import (
    check_batch,
    drop_lowest_negatives,
    num_dropped,
    sweep_with_gradient,
)

from .sap_refs import brute_drop, make_batch


def small_batch(q: int = 6, d: int = 6):
    gen = torch.Generator().manual_seed(0)
    sim = torch.rand(q, d, generator=gen) * 2 - 1
    labels = torch.arange(q) % 3
    rel = labels.unsqueeze(1) == labels[:d].unsqueeze(0)
    valid = ~torch.eye(q, d, dtype=torch.bool)
    return sim, rel, valid


@pytest.mark.parametrize("name", ["gsap", "msap", "infonce", "siglip"])
def test_bad_inputs_raise_clear_errors(name):
    loss_fn = build_loss(name)
    sim, rel, valid = small_batch()
    with pytest.raises(ValueError, match="2-D"):
        loss_fn(sim.flatten(), rel.flatten())
    with pytest.raises(ValueError, match="rel shape"):
        loss_fn(sim, rel[:, :-1])
    with pytest.raises(ValueError, match="valid shape"):
        loss_fn(sim, rel, valid[:-1])
    with pytest.raises(ValueError, match="rel must be a bool"):
        loss_fn(sim, rel.float())
    with pytest.raises(ValueError, match="valid must be a bool"):
        loss_fn(sim, rel, valid.long())
    with pytest.raises(ValueError, match="floating"):
        loss_fn(sim.long(), rel)
    with pytest.raises(ValueError, match="empty"):
        loss_fn(sim[:0], rel[:0])
    for bad in (math.nan, math.inf, -math.inf):
        broken = sim.clone()
        broken[1, 2] = bad
        with pytest.raises(ValueError, match="NaN/inf"):
            loss_fn(broken, rel, valid)


@pytest.mark.parametrize("name", ["gsap", "msap", "infonce"])
@pytest.mark.parametrize("temperature", [0.0, -0.1, math.nan])
def test_bad_temperature(name, temperature):
    with pytest.raises(ValueError, match="temperature"):
        build_loss(name, temperature=temperature)


@pytest.mark.parametrize("name", ["gsap", "msap"])
@pytest.mark.parametrize("rate", [-0.1, 1.0, 1.5])
def test_bad_neg_drop(name, rate):
    with pytest.raises(ValueError, match="neg_drop"):
        build_loss(name, neg_drop=rate)


@pytest.mark.parametrize("name", ["gsap", "msap", "infonce", "siglip"])
def test_no_positive_batch_gives_finite_loss_with_gradient(name):
    sim, _, valid = small_batch()
    leaf = sim.clone().requires_grad_(True)
    rel = torch.zeros_like(valid)
    loss_fn = build_loss(name) if name != "infonce" else build_loss(name, learnable_scale=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = loss_fn(leaf, rel, valid)
    loss.backward()
    assert torch.isfinite(loss) and leaf.grad is not None
    assert all(p.grad is not None for p in loss_fn.parameters())
    if name == "siglip":  # well defined without positives: pushes every pair down
        assert float(loss.detach()) > 0 and (leaf.grad[valid] > 0).all()
    else:
        assert float(loss.detach()) == 0.0
        assert (leaf.grad == 0).all()
        assert any("no valid positive" in str(w.message) for w in caught)


def test_positive_only_in_invalid_pairs_counts_as_none():
    sim, _, _ = small_batch()
    rel = torch.eye(6, dtype=torch.bool)
    valid = ~rel
    for name in ("gsap", "msap", "infonce"):
        with pytest.warns(UserWarning, match="no valid positive"):
            assert float(build_loss(name)(sim, rel, valid)) == 0.0


@pytest.mark.parametrize("name", ["infonce", "siglip"])
def test_half_precision_inputs_compute_in_float32(name):
    sim, rel, valid = small_batch()
    reference = build_loss(name)(sim.double(), rel, valid)
    for dtype in (torch.float16, torch.bfloat16):
        leaf = sim.to(dtype).requires_grad_(True)
        loss = build_loss(name)(leaf, rel, valid)
        loss.backward()
        assert loss.dtype == torch.float32 and leaf.grad.dtype == dtype
        assert torch.isfinite(leaf.grad.float()).all()
        tol = 2e-2 if dtype == torch.bfloat16 else 2e-3  # the inputs' own rounding
        assert float(loss.detach()) == pytest.approx(float(reference.detach()), rel=tol)


@pytest.mark.parametrize("rate", [0.0, 0.29, 0.5, 0.9])
@pytest.mark.parametrize("ties", [False, True])
def test_drop_lowest_negatives_is_the_sorted_selection_per_row(rate, ties):
    sim, rel, valid = make_batch(seed=4, ties=ties)
    kept = drop_lowest_negatives(sim, rel, valid, rate)
    for q in range(sim.shape[0]):
        cols = [d for d in range(sim.shape[1]) if valid[q, d]]
        items = list(enumerate(bool(rel[q, d]) for d in cols))
        keep = brute_drop(items, [float(sim[q, d]) for d in cols], rate)
        expected = torch.zeros(sim.shape[1], dtype=torch.bool)
        expected[[cols[i] for i in keep]] = True
        assert torch.equal(kept[q], expected), (q, rate)


def test_num_dropped_rounds_the_product_first():
    assert [num_dropped(100, r) for r in (0.29, 0.5, 0.999)] == [29, 50, 99]  # 0.29·100 = 28.99…
    counts = torch.tensor([0, 7, 100])
    assert num_dropped(counts, 0.29).tolist() == [math.floor(0.29 * n + 1e-9) for n in (0, 7, 100)]


def test_check_batch_fills_the_valid_mask():
    sim, rel = torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool)
    _, _, valid = check_batch(sim, rel, None)
    assert valid.dtype == torch.bool and bool(valid.all()) and valid.shape == (2, 3)
    with pytest.raises(ValueError, match=r"1 NaN/inf"):
        check_batch(torch.tensor([[0.0, math.inf]]), torch.zeros(1, 2, dtype=torch.bool), None)


calls: list[bool] = []


def _cubes(scores, weight, with_grad):
    """Per row Σ_j w_j s_j³ and its gradient 3 w_j s_j², written by hand."""
    calls.append(with_grad)
    value = (weight * scores.pow(3)).sum(-1)
    return value, (3 * weight * scores.square() if with_grad else None)


@pytest.mark.parametrize("shape", [(5,), (3, 4)])
def test_sweep_with_gradient_is_the_chain_rule_of_the_sweeps_own_gradient(shape):
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(shape, generator=gen, dtype=torch.float64)
    weight = torch.rand(shape[-1], generator=gen, dtype=torch.float64)
    upstream = torch.randn(shape[:-1], generator=gen, dtype=torch.float64)
    leaf = scores.clone().requires_grad_(True)
    (sweep_with_gradient(_cubes, leaf, weight) * upstream).sum().backward()
    ref = scores.clone().requires_grad_(True)
    ((weight * ref.pow(3)).sum(-1) * upstream).sum().backward()
    torch.testing.assert_close(leaf.grad, ref.grad, rtol=1e-12, atol=0)


def test_sweep_with_gradient_skips_the_gradient_when_none_is_needed_and_keeps_the_dtype():
    calls.clear()
    scores = torch.tensor([[0.5, -1.0]])
    value = sweep_with_gradient(_cubes, scores, torch.ones(2))
    assert calls == [False] and not value.requires_grad
    torch.testing.assert_close(value, torch.tensor([0.125 - 1.0]))
    half = torch.tensor([[0.5, -1.0]], dtype=torch.bfloat16, requires_grad=True)
    sweep_with_gradient(_cubes, half, torch.ones(2, dtype=torch.bfloat16)).sum().backward()
    assert calls == [False, True] and half.grad.dtype == torch.bfloat16
    torch.testing.assert_close(half.grad, torch.tensor([[0.75, 3.0]], dtype=torch.bfloat16))
