"""ROADMAP = SupAP + the calibration loss as released (Ramzi et al., NeurIPS 2021).

The released default (``roadmap/config/loss/roadmap.yaml`` of the authors'
repository) is SupAP (τ = 0.01, ρ = 100, offset 1.44, δ = 0.05, weight 1) plus
``CalibrationLoss`` (pytorch-metric-learning's ``ContrastiveLoss`` on
dot-product similarities, pos_margin 0.9, neg_margin 0.6, weight 1; its
default reducer averages the non-zero positive-pair losses and, separately,
the non-zero negative-pair losses, then adds the two). The reference below
transcribes that: a loop over all ordered pairs i ≠ j of a labelled batch of
unit embeddings, in float64, with SupAP from the paper's rank form
(``tests/surrogate_refs.py``).
"""

from __future__ import annotations

import pytest
import torch
from surrogate_refs import brute_supap

from rl_gap.losses import build_loss
from rl_gap.losses.roadmap import calibration_loss


def released_calibration(emb: torch.Tensor, labels: list[int], pos_m=0.9, neg_m=0.6):
    pos_losses, neg_losses = [], []
    for i in range(len(labels)):
        for j in range(len(labels)):
            if i == j:
                continue
            s = emb[i] @ emb[j]
            if labels[i] == labels[j]:
                pos_losses.append(torch.relu(pos_m - s))
            else:
                neg_losses.append(torch.relu(s - neg_m))

    def avg_non_zero(losses):
        nonzero = [v for v in losses if float(v.detach()) > 0]
        return sum(nonzero) / len(nonzero) if nonzero else torch.zeros((), dtype=emb.dtype)

    return avg_non_zero(pos_losses) + avg_non_zero(neg_losses)


def _supap_term(sim, rel, valid, per_query: bool):
    kw = dict(tau=0.01, rho=100.0, offset=1.44, margin=0.05)
    if not per_query:
        return 1 - brute_supap(sim[valid], rel[valid].tolist(), **kw)
    aps = [
        brute_supap(sim[q][valid[q]], rel[q][valid[q]].tolist(), **kw)
        for q in range(sim.shape[0])
        if bool((rel[q] & valid[q]).any())
    ]
    return 1 - torch.stack(aps).mean()


def _batch(seed: int, n: int = 12, classes: int = 4, spread: float = 0.8):
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, 8, generator=gen, dtype=torch.float64)
    labels = [i % classes for i in range(n)]
    noise = spread * torch.randn(n, 8, generator=gen, dtype=torch.float64)
    emb = torch.nn.functional.normalize(centres[labels] + noise, dim=1)
    return emb, labels


@pytest.mark.parametrize("name", ["roadmap", "groadmap"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roadmap_matches_released_formula_value_and_gradient(name, seed):
    emb, labels = _batch(seed)
    lab = torch.tensor(labels)
    rel = lab[:, None] == lab[None]
    valid = ~torch.eye(len(labels), dtype=torch.bool)
    ref_emb = emb.clone().requires_grad_(True)
    ref_sim = ref_emb @ ref_emb.T
    ref = _supap_term(ref_sim, rel, valid, name == "roadmap") + released_calibration(
        ref_emb, labels
    )
    ref.backward()
    leaf = emb.clone().requires_grad_(True)
    loss = build_loss(name)(leaf @ leaf.T, rel & valid, valid)
    loss.backward()
    torch.testing.assert_close(loss.detach(), ref.detach(), rtol=0, atol=1e-10)
    torch.testing.assert_close(leaf.grad, ref_emb.grad, rtol=1e-7, atol=1e-9)


def test_supap_stays_the_ap_term_alone():
    emb, labels = _batch(4)
    lab = torch.tensor(labels)
    valid = ~torch.eye(len(labels), dtype=torch.bool)
    rel = (lab[:, None] == lab[None]) & valid
    sim = emb @ emb.T
    for ap_name, full_name in (("supap", "roadmap"), ("gsupap", "groadmap")):
        ap = build_loss(ap_name)(sim, rel, valid)
        assert float(ap) == pytest.approx(float(_supap_term(sim, rel, valid, ap_name == "supap")))
        full = build_loss(full_name)(sim, rel, valid)
        calib = float(released_calibration(emb, labels))
        assert calib > 0.05  # the batch has pairs on the wrong side of both margins
        assert float(full - ap) == pytest.approx(calib, abs=1e-12)


def test_calibration_hand_computed():
    # positives 0.5 (hinge 0.4) and 0.95 (0); negatives 0.7 (0.1), 0.2 (0) and 0.8 (0.2).
    sim = torch.tensor([[0.5, 0.95, 0.7], [0.2, 0.8, 0.3]], dtype=torch.float64)
    rel = torch.tensor([[True, True, False], [False, False, True]])
    # positive hinges 0.4, 0, 0.6 -> mean of non-zero 0.5; negatives 0.1, 0, 0.2 -> 0.15.
    assert float(calibration_loss(sim, rel)) == pytest.approx(0.5 + 0.15)
    assert float(calibration_loss(sim, rel, pos_margin=0.0, neg_margin=1.0)) == 0.0
    weighted = build_loss("roadmap", calibration_weight=2.0)(sim, rel)
    assert float(weighted - build_loss("supap")(sim, rel)) == pytest.approx(2 * 0.65)


@pytest.mark.parametrize(
    "kwargs", [{"pos_margin": float("nan")}, {"calibration_weight": -1.0}, {"neg_margin": True}]
)
def test_bad_calibration_settings_are_rejected(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        build_loss("roadmap", **kwargs)
