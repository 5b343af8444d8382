"""The smoothed-AP sweeps (rl_gap/losses/smoothed_ap.py) against a brute-force float64 smoothed AP."""

from __future__ import annotations

import pytest
import torch

from rl_gap.losses import smoothed_ap_exact

from .sap_refs import brute_smoothed_ap


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
