"""SoftBin, BlackBox and SupAP values and gradients against the float64 references.

The references (``tests/surrogate_refs.py``) are written from the definitions:
brute-force lists, FastAP's published formula, exact AP, and BlackBox's
defining finite-difference gradient.
"""

from __future__ import annotations

import pytest
import torch
from surrogate_refs import (
    blackbox_reference,
    brute_softbin_ap,
    brute_supap,
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


@pytest.mark.parametrize("per_query", [True, False])
@pytest.mark.parametrize("lam", [0.5, 4.0, 40.0])
@pytest.mark.parametrize("margin", [0.0, 0.05])
def test_blackbox_value_and_defining_gradient(per_query, lam, margin):
    sim, rel, valid = make_batch(seed=int(lam * 10) + int(margin * 100), q=8, d=10)
    name = "blackbox" if per_query else "gblackbox"
    loss_fn = build_loss(name, lambda_val=lam, margin=margin)
    value, grad = value_and_grad(loss_fn, sim, rel, valid, scale=3.0)
    ref_value, ref_grad = blackbox_reference(sim, rel, valid, per_query, lam, margin, scale=3.0)
    assert float(value) == pytest.approx(ref_value, abs=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    assert (grad != 0).sum() >= 4  # λ large enough to move ranks: a real check


@pytest.mark.parametrize("per_query", [True, False])
def test_blackbox_forward_is_exact_ap_with_ties(per_query):
    sim, rel, valid = make_batch(seed=21, on_grid=5)  # many ties
    loss = build_loss("blackbox" if per_query else "gblackbox", margin=0.0)(sim, rel, valid)
    aps = [exact_ap(s.tolist(), p) for s, p in lists(sim, rel, valid, per_query)]
    assert float(loss) == pytest.approx(1 - sum(aps) / len(aps), abs=1e-12)


def test_blackbox_neg_drop_and_symmetric():
    sim, rel, valid = make_batch(seed=4, q=8, d=8)
    for per_query in (True, False):
        name = "blackbox" if per_query else "gblackbox"
        value, grad = value_and_grad(build_loss(name, neg_drop=0.3), sim, rel, valid)
        ref_value, ref_grad = blackbox_reference(sim, rel, valid, per_query, 4.0, 0.02, alpha=0.3)
        assert float(value) == pytest.approx(ref_value, abs=1e-12)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    sym = build_loss("blackbox", margin=0.0, symmetric=True)(sim, rel, valid)
    ref = mean_list_loss(
        sim,
        rel,
        valid,
        True,
        lambda s, p: torch.tensor(exact_ap(s.tolist(), p), dtype=torch.float64),
        0,
        True,
    )
    assert float(sym) == pytest.approx(float(ref), abs=1e-12)


SUPAP_SETTINGS = [
    dict(temperature=0.01, rho=100.0, offset=1.44, margin=0.05),  # released defaults
    dict(temperature=0.1, rho=10.0, offset=1.0, margin=0.0),  # two-piece form
    dict(temperature=0.05, rho=3.0, offset=2.0, margin=0.2),
]


@pytest.mark.parametrize("per_query", [True, False])
@pytest.mark.parametrize("setting", range(len(SUPAP_SETTINGS)))
@pytest.mark.parametrize("alpha", [0.0, 0.5])
def test_supap_matches_brute_force_value_and_gradient(per_query, setting, alpha):
    kw = SUPAP_SETTINGS[setting]
    sim, rel, valid = make_batch(seed=30 + setting, q=8, d=10)
    name = "supap" if per_query else "gsupap"
    value, grad = value_and_grad(build_loss(name, neg_drop=alpha, **kw), sim, rel, valid, 1.7)
    ref_leaf = sim.clone().requires_grad_(True)
    args = (kw["temperature"], kw["rho"], kw["offset"], kw["margin"])
    ref = mean_list_loss(
        ref_leaf, rel, valid, per_query, lambda s, p: brute_supap(s, p, *args), alpha
    )
    (1.7 * ref).backward()
    torch.testing.assert_close(value, ref.detach(), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(grad, ref_leaf.grad, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("chunk_size", [1, 3, 1000])
def test_supap_chunking_and_symmetric(chunk_size):
    sim, rel, valid = make_batch(seed=8, q=9, d=9)
    for name in ("supap", "gsupap"):
        kwargs = dict(chunk_size=chunk_size, temperature=0.05)
        if name == "supap":
            kwargs["symmetric"] = True
        value, grad = value_and_grad(build_loss(name, **kwargs), sim, rel, valid)
        ref_leaf = sim.clone().requires_grad_(True)
        ref = mean_list_loss(
            ref_leaf,
            rel,
            valid,
            name == "supap",
            lambda s, p: brute_supap(s, p, 0.05, 100.0, 1.44, 0.05),
            symmetric=name == "supap",
        )
        ref.backward()
        torch.testing.assert_close(value, ref.detach(), rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(grad, ref_leaf.grad, rtol=1e-9, atol=1e-11)


def test_supap_gradcheck_and_upper_bound():
    sim, rel, valid = make_batch(seed=13, q=5, d=6)
    for name in ("supap", "gsupap"):
        loss_fn = build_loss(name, temperature=0.2, rho=5.0, margin=0.1)
        leaf = sim.clone().requires_grad_(True)
        assert torch.autograd.gradcheck(lambda s, f=loss_fn: f(s, rel, valid), (leaf,), eps=1e-7)
    # offset ≥ 1 makes H⁻ ≥ step (no ties here): 1 − SupAP ≥ 1 − AP, list by list.
    for per_query, name in ((True, "supap"), (False, "gsupap")):
        aps = [exact_ap(s.tolist(), p) for s, p in lists(sim, rel, valid, per_query)]
        assert float(build_loss(name)(sim, rel, valid)) >= 1 - sum(aps) / len(aps)
