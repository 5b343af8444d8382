"""SoftBin (rl_gap/losses/softbin.py) values and gradients against float64 references.

The references (``tests/surrogate_refs.py``) are written from the definitions:
brute-force lists, FastAP's published formula, exact AP with pessimistic ties.
``num_bins`` means what it means in FastAP's released code (Cakir et al., CVPR 2019;
github.com/kunhe/FastAP-metric-learning, ``pytorch/FastAP_loss.py``): squared distances
of unit embeddings binned over [0, 4] with ``Delta = 4 / num_bins`` and
``Z = linspace(0, 4, num_bins + 1)``, i.e. ``num_bins`` intervals and ``num_bins + 1``
centres; ``released_fastap_loss`` transcribes that forward pass in float64 (one batch,
labels give the positives, the diagonal excluded), differentiated by autograd.
"""

from __future__ import annotations

import pytest
import torch
from surrogate_refs import (
    brute_softbin_ap,
    exact_ap,
    fastap_transcription,
    lists,
    make_batch,
    mean_list_loss,
    value_and_grad,
)

import rl_gap.losses.softbin as softbin_module
from rl_gap.losses import build_loss


@pytest.mark.parametrize("per_query", [True, False])
@pytest.mark.parametrize("num_bins", [5, 10, 41])
@pytest.mark.parametrize("alpha", [0.0, 0.4])
def test_softbin_matches_brute_force_value_and_gradient(per_query, num_bins, alpha):
    sim, rel, valid = make_batch(seed=num_bins)
    name = "softbin" if per_query else "gsoftbin"
    loss_fn = build_loss(name, num_bins=num_bins, neg_drop=alpha)
    value, grad = value_and_grad(loss_fn, sim, rel, valid, scale=2.5)
    ref_leaf = sim.clone().requires_grad_(True)
    ref = mean_list_loss(
        ref_leaf, rel, valid, per_query, lambda s, p: brute_softbin_ap(s, p, num_bins), alpha
    )
    (2.5 * ref).backward()
    torch.testing.assert_close(value, ref.detach(), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(grad, ref_leaf.grad, rtol=1e-9, atol=1e-11)
    assert grad.abs().sum() > 0


@pytest.mark.parametrize("per_query", [True, False])
def test_softbin_items_binned_in_chunks_match_brute_force(per_query, monkeypatch):
    monkeypatch.setattr(softbin_module, "ITEM_CHUNK", 5)  # chunks straddle rows (D = 9)
    sim, rel, valid = make_batch(seed=6)
    loss_fn = build_loss("softbin" if per_query else "gsoftbin", num_bins=8, neg_drop=0.2)
    value, grad = value_and_grad(loss_fn, sim, rel, valid, scale=1.3)
    ref_leaf = sim.clone().requires_grad_(True)
    ref = mean_list_loss(
        ref_leaf, rel, valid, per_query, lambda s, p: brute_softbin_ap(s, p, 8), 0.2
    )
    (1.3 * ref).backward()
    torch.testing.assert_close(value, ref.detach(), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(grad, ref_leaf.grad, rtol=1e-9, atol=1e-11)


def test_softbin_symmetric_matches_brute_force():
    sim, rel, valid = make_batch(seed=3, q=8, d=8)
    value, _ = value_and_grad(build_loss("softbin", num_bins=7, symmetric=True), sim, rel, valid)
    ref = mean_list_loss(sim, rel, valid, True, lambda s, p: brute_softbin_ap(s, p, 7), 0, True)
    torch.testing.assert_close(value, ref, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("num_bins", [10, 25])
def test_softbin_equals_published_fastap_on_unit_embeddings(num_bins):
    gen = torch.Generator().manual_seed(num_bins)
    emb = torch.randn(12, 5, generator=gen, dtype=torch.float64)
    emb = torch.nn.functional.normalize(emb, dim=1)
    labels = torch.arange(12) % 3
    sim, rel = emb @ emb.T, labels[:, None] == labels[None]
    valid = ~torch.eye(12, dtype=torch.bool)
    expected = []
    for q in range(12):
        cols = [d for d in range(12) if d != q]
        pos = [bool(rel[q, d]) for d in cols]
        expected.append(fastap_transcription(emb[q], emb[cols], pos, num_bins))
    loss = build_loss("softbin", num_bins=num_bins)(sim, rel, valid)
    assert float(loss) == pytest.approx(1 - sum(expected) / len(expected), abs=1e-12)


@pytest.mark.parametrize("per_query", [True, False])
def test_softbin_on_bin_centres_is_exact_ap_with_pessimistic_ties(per_query):
    sim, rel, valid = make_batch(seed=5, on_grid=9)
    loss = build_loss("softbin" if per_query else "gsoftbin", num_bins=8)(sim, rel, valid)
    aps = [exact_ap(s.tolist(), p) for s, p in lists(sim, rel, valid, per_query)]
    assert float(loss) == pytest.approx(1 - sum(aps) / len(aps), abs=1e-12)


def test_softbin_gradcheck_float64():
    sim, rel, valid = make_batch(seed=11, q=5, d=6)
    for name in ("softbin", "gsoftbin"):
        loss_fn = build_loss(name, num_bins=6)
        leaf = sim.clone().requires_grad_(True)
        assert torch.autograd.gradcheck(lambda s, f=loss_fn: f(s, rel, valid), (leaf,), eps=1e-7)


def test_softbin_range_is_checked_with_rounding_tolerance():
    sim, rel, valid = make_batch(seed=1)
    with pytest.raises(ValueError, match=r"sim_range \[-1.0, 1.0\].*normalise"):
        build_loss("gsoftbin")(sim * 3, rel, valid)
    nudged = sim.clone()
    nudged[0, 0] = 1.004  # a bf16 cosine of ~1: clamped into the top bin, no error
    clamped = nudged.clone()
    clamped[0, 0] = 1.0
    for name in ("softbin", "gsoftbin"):
        torch.testing.assert_close(
            build_loss(name)(nudged, rel, valid), build_loss(name)(clamped, rel, valid)
        )
    invalid_only = sim.clone()
    invalid_only[~valid] = 50.0  # ignored pairs are not range-checked
    build_loss("softbin")(invalid_only, rel, valid)
    wide = build_loss("softbin", sim_range=(-3, 3))
    assert torch.isfinite(wide(sim * 3, rel, valid))


def released_fastap_loss(sim: torch.Tensor, labels: torch.Tensor, num_bins: int) -> torch.Tensor:
    """1 − mean FastAP, transcribed from the released forward (``dist2 = 2 − 2·sim``)."""
    n = labels.numel()
    aff = 2 * (labels[:, None] == labels[None]).double() - 1
    aff = aff.masked_fill(torch.eye(n, dtype=torch.bool), 0)
    i_pos, i_neg = (aff > 0).double(), (aff < 0).double()
    n_pos = i_pos.sum(1)
    dist2 = 2 - 2 * sim
    delta = 4.0 / num_bins
    z = torch.linspace(0.0, 4.0, steps=num_bins + 1, dtype=torch.float64)
    h_pos = torch.stack(
        [((1 - (dist2 - zl).abs() / delta).clamp(min=0) * i_pos).sum(1) for zl in z]
    )
    h_neg = torch.stack(
        [((1 - (dist2 - zl).abs() / delta).clamp(min=0) * i_neg).sum(1) for zl in z]
    )
    h_pos, h_neg = h_pos.T, h_neg.T  # (N, L + 1)
    big_h_pos = h_pos.cumsum(1)
    big_h = (h_pos + h_neg).cumsum(1)
    # released: FastAP[isnan | isinf] = 0, i.e. the empty-prefix terms (H = 0) are 0; the
    # clamp keeps autograd free of 0/0 there.
    fast_ap = torch.where(big_h > 0, h_pos * big_h_pos / big_h.clamp(min=1e-300), 0.0)
    fast_ap = fast_ap.sum(1) / n_pos
    return 1 - fast_ap[~torch.isnan(fast_ap)].mean()


def _batch(seed: int, n: int = 15, classes: int = 4):
    gen = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(
        torch.randn(n, 6, generator=gen, dtype=torch.float64), dim=1
    )
    labels = torch.arange(n) % classes
    return emb @ emb.T, labels


@pytest.mark.parametrize("num_bins", [1, 2, 5, 10, 33])
def test_softbin_value_and_gradient_match_released_fastap(num_bins):
    sim, labels = _batch(seed=num_bins)
    rel = labels[:, None] == labels[None]
    valid = ~torch.eye(labels.numel(), dtype=torch.bool)
    rel &= valid
    ref_leaf = sim.clone().requires_grad_(True)
    ref = released_fastap_loss(ref_leaf, labels, num_bins)
    ref.backward()
    leaf = sim.clone().requires_grad_(True)
    loss = build_loss("softbin", num_bins=num_bins)(leaf, rel, valid)
    loss.backward()
    torch.testing.assert_close(loss.detach(), ref.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(leaf.grad, ref_leaf.grad, rtol=1e-9, atol=1e-12)


def test_default_is_fastaps_ten_intervals():
    sim, labels = _batch(seed=7)
    rel = (labels[:, None] == labels[None]) & ~torch.eye(labels.numel(), dtype=torch.bool)
    valid = ~torch.eye(labels.numel(), dtype=torch.bool)
    loss = build_loss("softbin")(sim, rel, valid)
    assert float(loss) == pytest.approx(float(released_fastap_loss(sim, labels, 10)), abs=1e-12)


def test_hand_computed_one_and_two_intervals():
    # One positive at s = 1, one negative at s = 0 (squared distances 0 and 2).
    sim = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    rel = torch.tensor([[True, False]])
    valid = torch.ones(1, 2, dtype=torch.bool)
    # 1 interval: centres at D = 0, 4 (Δ = 4); the negative splits 1/2, 1/2 between them:
    # FastAP = h⁺_0 H⁺_0 / H_0 = 1 · 1 / 1.5.
    assert float(build_loss("softbin", num_bins=1)(sim, rel, valid)) == pytest.approx(1 - 2 / 3)
    # 2 intervals: centres at D = 0, 2, 4: the two items in separate bins, AP = 1.
    assert float(build_loss("softbin", num_bins=2)(sim, rel, valid)) == pytest.approx(0.0)


def test_global_softbin_uses_the_same_grid():
    sim, labels = _batch(seed=3, n=6, classes=2)
    valid = ~torch.eye(6, dtype=torch.bool)
    rel = (labels[:, None] == labels[None]) & valid
    # One flattened list = FastAP of one "query" whose items are all valid pairs.
    flat = sim[valid]
    pos = rel[valid]
    delta, z = 4.0 / 4, torch.linspace(0.0, 4.0, 5, dtype=torch.float64)
    pulse = (1 - ((2 - 2 * flat)[None] - z[:, None]).abs() / delta).clamp(min=0)
    h_pos, h = (pulse * pos).sum(1), pulse.sum(1)
    terms = h_pos * h_pos.cumsum(0) / h.cumsum(0)
    expected = 1 - float(torch.where(torch.isfinite(terms), terms, 0.0).sum() / pos.sum())
    got = float(build_loss("gsoftbin", num_bins=4)(sim, rel, valid))
    assert got == pytest.approx(expected, abs=1e-12)


def test_num_bins_zero_is_rejected():
    with pytest.raises(ValueError, match="num_bins"):
        build_loss("softbin", num_bins=0)
