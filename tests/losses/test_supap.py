"""SupAP (rl_gap/losses/supap.py) against the float64 references of ``tests/surrogate_refs.py``
(the paper's rank form on brute-force lists), including ``start`` (H⁻'s step at t = 0 in the
margin band) at ROADMAP's released iNaturalist setting ``start: 0.0, offset: 1.0``."""

from __future__ import annotations

import math

import pytest
import torch
from surrogate_refs import (
    brute_supap,
    exact_ap,
    lists,
    make_batch,
    mean_list_loss,
    value_and_grad,
)

from rl_gap.losses import build_loss
from rl_gap.losses.roadmap import calibration_loss
from rl_gap.losses.supap import h_minus

INAT = dict(temperature=0.01, rho=100.0, offset=1.0, margin=0.05, start=0.0)
DEFAULT = dict(temperature=0.01, rho=100.0, offset=1.44, margin=0.05, start=0.5)


def h_minus_formula(t, temperature, rho, offset, margin, start):
    """H⁻(t) = σ(t/τ) for t ≤ 0, start + σ(t/τ) for 0 < t ≤ δ, ρ·t + offset above δ."""
    sigmoid = 1.0 / (1.0 + math.exp(-t / temperature))
    if t <= 0:
        return sigmoid
    if t <= margin:
        return start + sigmoid
    return rho * t + offset


def supap_formula(scores, positive, temperature, rho, offset, margin, start):
    """(1/|P|) Σ_k rk⁺(k) / (rk⁺(k) + rk⁻(k)), rk⁺ an exact step with H(0) = 1, by loops."""
    total, pos = 0.0, [k for k, p in enumerate(positive) if p]
    for k in pos:
        rank_pos = sum(1.0 for j in pos if scores[j] >= scores[k])
        rank_neg = sum(
            h_minus_formula(scores[j] - scores[k], temperature, rho, offset, margin, start)
            for j, p in enumerate(positive)
            if not p
        )
        total += rank_pos / (rank_pos + rank_neg)
    return total / len(pos)


@pytest.mark.parametrize("setting", [DEFAULT, INAT, {**INAT, "start": 0.3, "margin": 0.2}])
def test_h_minus_is_the_piecewise_formula(setting):
    ts = [-0.3, -0.01, 0.0, 1e-4, 0.02, setting["margin"], setting["margin"] + 1e-6, 0.4]
    value, _ = h_minus(torch.tensor(ts, dtype=torch.float64), *setting.values())
    expected = [h_minus_formula(t, **setting) for t in ts]
    torch.testing.assert_close(value, torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("name", ["supap", "gsupap"])
@pytest.mark.parametrize("setting", [INAT, {**INAT, "start": 0.25, "margin": 0.3}])
def test_start_value_and_gradient_match_the_formula(name, setting):
    sim, rel, valid = make_batch(seed=41, q=8, d=10)
    diff = sim[:, None, :] - sim[:, :, None]
    assert ((diff > 0) & (diff <= setting["margin"])).any()  # pairs in the band: start matters
    value, grad = value_and_grad(build_loss(name, **setting), sim, rel, valid, 1.3)
    per_query = name == "supap"
    loops = mean_list_loss(
        sim, rel, valid, per_query,
        lambda s, p: torch.tensor(supap_formula(s.tolist(), p, **setting), dtype=torch.float64),
    )  # fmt: skip
    torch.testing.assert_close(value, loops, rtol=1e-12, atol=1e-13)
    leaf = sim.clone().requires_grad_(True)
    ref = mean_list_loss(
        leaf, rel, valid, per_query, lambda s, p: brute_supap(s, p, *setting.values())
    )
    (1.3 * ref).backward()
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-9, atol=1e-11)
    default = build_loss(name, **{**setting, "start": 0.5})(sim, rel, valid)
    assert abs(float(default) - float(value)) > 1e-3  # the setting reached the loss


@pytest.mark.parametrize("name", ["roadmap", "groadmap"])
def test_roadmap_passes_start_to_its_ap_term(name):
    sim, rel, valid = make_batch(seed=42, q=6, d=9)
    got = build_loss(name, **INAT)(sim, rel, valid)
    ap_term = build_loss(name.replace("roadmap", "supap"), **INAT)(sim, rel, valid)
    torch.testing.assert_close(got, ap_term + calibration_loss(sim, rel, valid))


@pytest.mark.parametrize("start", [-0.1, math.nan, math.inf])
@pytest.mark.parametrize("name", ["supap", "gsupap", "roadmap"])
def test_start_must_be_finite_and_non_negative(name, start):
    with pytest.raises(ValueError, match="start"):
        build_loss(name, start=start)


def test_default_start_is_the_paper_half():
    assert build_loss("supap").start == 0.5 and build_loss("groadmap").start == 0.5


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
