"""BlackBox AP (rl_gap/losses/blackbox_ap.py) against the float64 references of
``tests/surrogate_refs.py``: exact AP with ties, and the loss and gradient from BlackBox's
defining formula with loop-counted ranks."""

from __future__ import annotations

import pytest
import torch
from surrogate_refs import (
    blackbox_reference,
    exact_ap,
    lists,
    make_batch,
    mean_list_loss,
    value_and_grad,
)

from rl_gap.losses import build_loss


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
