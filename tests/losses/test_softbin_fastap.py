"""SoftBin's ``num_bins`` means what ``num_bins`` means in FastAP's released code.

FastAP (Cakir et al., CVPR 2019; github.com/kunhe/FastAP-metric-learning,
``pytorch/FastAP_loss.py``) bins squared distances of unit embeddings over
[0, 4] with ``Delta = 4 / num_bins`` and ``Z = linspace(0, 4, num_bins + 1)``:
``num_bins`` intervals, ``num_bins + 1`` centres. The reference below is a
transcription of that forward pass in float64 (one batch, labels give the
positives, the diagonal excluded), differentiated by autograd.
"""

from __future__ import annotations

import pytest
import torch

from rl_gap.losses import build_loss


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
