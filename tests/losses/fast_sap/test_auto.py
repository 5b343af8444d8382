"""gSAP ``impl="auto"`` never raises on a valid batch; bad tolerances fail at construction
(issue 12, item 3)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from gsap_contract import reference

from rl_gap.losses import build_loss
from rl_gap.losses.fast_sap import kernel
from rl_gap.losses.fast_sap.grid import PlanError


def square_batch(batch: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(batch) // 4
    emb = F.normalize(torch.randn(batch, 32, generator=gen), dim=1)
    return emb @ emb.T, labels[:, None] == labels[None, :], ~torch.eye(batch, dtype=torch.bool)


@pytest.mark.parametrize("tolerance", [0.0, -1e-8, math.nan, math.inf, 1.0, 1e-14, "tight"])
@pytest.mark.parametrize("impl", ["auto", "fast", "exact"])
def test_bad_tolerance_rejected_at_construction(tolerance, impl):
    with pytest.raises(ValueError, match="tolerance"):
        build_loss("gsap", impl=impl, tolerance=tolerance)


@pytest.mark.parametrize(("tau", "scale"), [(1e-6, 1.0), (1e-2, 1e4)])
@pytest.mark.parametrize("neg_drop", [0.0, 0.9])
def test_auto_falls_back_to_exact_when_no_plan(monkeypatch, tau, scale, neg_drop):
    # Scores x 1e4 at τ = 0.01 without dropping: B = 128 is big enough for auto to pick
    # the fast kernel by itself. Elsewhere (τ = 1e-6 needs B ~ 350; dropping shrinks the
    # list) the size threshold is lowered so that auto picks it on a small batch.
    natural = scale > 1 and neg_drop == 0
    if not natural:
        monkeypatch.setattr(kernel, "FAST_MIN_COMPARISONS", 0)
    sim, rel, valid = square_batch(128 if natural else 48)
    sim = sim * scale
    num_pos = int((rel & valid).sum())
    num_kept = int(valid.sum()) - math.floor((int(valid.sum()) - num_pos) * neg_drop + 1e-9)
    loss_fn = build_loss("gsap", temperature=tau, impl="auto", neg_drop=neg_drop)
    assert loss_fn.select_impl(num_pos, num_kept) == "fast"
    with pytest.raises(PlanError):  # what auto used to run into
        build_loss("gsap", temperature=tau, impl="fast", neg_drop=neg_drop)(sim, rel, valid)
    leaf = sim.double().requires_grad_()
    with pytest.warns(UserWarning, match="exact"):
        loss = loss_fn(leaf, rel, valid)
    loss.backward()
    # Reference: float64 brute force over the kept list (exact path's own selection).
    flat, positive = sim.double()[valid], rel[valid]
    negatives = (~positive).nonzero().squeeze(1)
    order = sorted(negatives.tolist(), key=lambda j: (float(flat[j]), j))
    keep = torch.ones_like(positive)
    keep[order[: math.floor(len(order) * neg_drop + 1e-9)]] = False
    ref_value, ref_grad, _, _ = reference(flat[keep], positive[keep], tau)
    assert abs(float(loss.detach()) - (1.0 - ref_value)) <= 1e-12
    grad = leaf.grad[valid][keep]
    assert torch.allclose(grad, -ref_grad, rtol=1e-9, atol=1e-12 * float(ref_grad.abs().max()))
    # One warning per loss module, not one per step.
    with warnings_recorded() as caught:
        loss_fn(sim, rel, valid)
    assert not [w for w in caught if "exact" in str(w.message)]


def warnings_recorded():
    import warnings

    class _Recorder(warnings.catch_warnings):
        def __init__(self):
            super().__init__(record=True)

        def __enter__(self):
            caught = super().__enter__()
            warnings.simplefilter("always")
            return caught

    return _Recorder()
