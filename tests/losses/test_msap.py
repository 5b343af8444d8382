"""mSAP (rl_gap/losses/msap.py) against a brute-force float64 smoothed AP of every row (``sap_refs``)."""

from __future__ import annotations

import pytest
import torch

from rl_gap.losses import build_loss

from .sap_refs import (
    LargestTensor,
    assert_matches,
    brute_drop,
    brute_smoothed_ap,
    make_batch,
    metric_batch,
)

TEMPERATURES = [1e-1, 1e-2, 1e-3]


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


@pytest.mark.parametrize("tau", TEMPERATURES)
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("alpha", [0.0, 0.5])
@pytest.mark.parametrize("symmetric", [False, True])
def test_msap_matches_brute_force(tau, ties, alpha, symmetric):
    sim, rel, valid = make_batch(seed=int(tau * 1e4) + 3 * ties, ties=ties)
    loss_fn = build_loss("msap", temperature=tau, neg_drop=alpha, symmetric=symmetric)
    reference = lambda s, r, v: brute_msap(s, r, v, tau, alpha, symmetric)  # noqa: E731
    assert_matches(loss_fn, reference, sim, rel, valid)


@pytest.mark.parametrize("chunk_size", [1, 3])
def test_msap_chunked_matches_brute_force(chunk_size):
    sim, rel, valid = make_batch(seed=5, ties=False)
    loss_fn = build_loss("msap", temperature=0.05, chunk_size=chunk_size)
    assert_matches(loss_fn, lambda s, r, v: brute_msap(s, r, v, 0.05), sim, rel, valid)


def test_msap_chunks_rows():
    sim, rel, valid = metric_batch()
    leaf = sim.clone().requires_grad_(True)
    with LargestTensor() as mode:
        build_loss("msap", temperature=0.01, chunk_size=2)(leaf, rel, valid).backward()
    # One-shot Smooth-AP would hold rows × K × D = 64 · 3 · 64 comparisons.
    assert mode.numel <= sim.numel() < 64 * 3 * 64
