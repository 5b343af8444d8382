"""The fast gSAP kernel at its stated tolerance, including where its truncation bites.

On ordinary batches the kernel uses a small fraction of its error budget, so a
test at the stated tolerance there only catches errors that grow by orders of
magnitude. ``test_kernel_sums_within_half_tolerance`` checks the plan's own
per-sum guarantee directly, ``test_kernel_sums_at_coarse_cell_edges`` puts
sources and query at opposite coarse-cell edges (the coarse expansion's worst
offset), and ``test_truncation_at_window_edge`` builds the worst case of one
budget term instead: every negative just outside the grid window (the band
truncation, ``4 M e^(−U) <= tolerance / 16``), where the realised error is a
fixed fraction (~1/70) of the tolerance, so a truncation budget 160x larger
fails it (see docs/fast_gsap.md).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gsap_contract import assert_within_contract, reference

from rl_gap.losses.fast_sap import binning as fast_binning
from rl_gap.losses.fast_sap import native as fast_native
from rl_gap.losses.fast_sap.grid import plan_grid
from rl_gap.losses.fast_sap.kernel import _forward_sums, smoothed_ap_fast


def fast(scores, positive, tau, tolerance, valid=None):
    s = scores.detach().clone().requires_grad_()
    value = smoothed_ap_fast(s, positive, tau, tolerance=tolerance, valid=valid)
    value.backward()
    return value.detach(), s.grad


def clustered(batch: int, seed: int):
    """Tight clusters around one direction (hard negatives), flattened off-diagonal pairs."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(batch) // 4
    centres = F.normalize(
        torch.randn(1, 32, generator=gen) + 0.08 * torch.randn(batch, 32, generator=gen)
    )
    emb = F.normalize(centres[labels] + 0.01 * torch.randn(batch, 32, generator=gen), dim=1)
    valid = ~torch.eye(batch, dtype=torch.bool)
    return (emb @ emb.T)[valid].double(), (labels[:, None] == labels[None, :])[valid]


@pytest.fixture(params=["native", "torch"])
def passes(request, monkeypatch):
    if request.param == "native" and fast_native.native_library() is None:
        pytest.skip("no C++ compiler: the optional native passes are unavailable")
    monkeypatch.setattr(fast_binning, "USE_NATIVE", request.param == "native")


@pytest.mark.parametrize("tolerance", [1e-3, 1e-6, 1e-10])
@pytest.mark.parametrize("tau", [1e-1, 1e-2, 1e-3, 1e-4])
def test_every_tolerance_is_met_in_float64(passes, tolerance, tau):
    # A coarser tolerance gives a coarser plan (lower orders, shorter band): each is
    # checked at its own bound.
    scores, positive = clustered(80, seed=int(-torch.log10(torch.tensor(tau))))
    value, grad = fast(scores, positive, tau, tolerance)
    assert_within_contract(value, grad, reference(scores, positive, tau), tolerance)


def brute_force_sums(scores: torch.Tensor, positive: torch.Tensor, tau: float):
    """R_A, R_P, D_A, D_P at every positive, float64, self terms included (σ(0), σ'(0))."""
    s = scores.to(torch.float64)
    pos_scores = s[positive]
    sig = torch.sigmoid((s.unsqueeze(0) - pos_scores.unsqueeze(1)) / tau)  # (P, M)
    dsig = sig * (1.0 - sig)
    return (
        0.5 + sig.sum(1),
        0.5 + sig[:, positive].sum(1),
        dsig.sum(1),
        dsig[:, positive].sum(1),
    )


@pytest.mark.parametrize("tolerance", [1e-4, 1e-8])
@pytest.mark.parametrize("tau", [1e-1, 1e-2, 1e-3, 1e-4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_sums_within_half_tolerance(passes, tolerance, tau, dtype):
    # The plan's own guarantee, term by term: every rank / derivative sum at the
    # positives within tolerance/2 relative. (The value and gradients inherit it with
    # the factors of gsap_contract; there cancellations and averaging hide an error
    # that is already several times too large here.)
    gen = torch.Generator().manual_seed(21)
    for scores, positive in (
        clustered(96, seed=22),
        (
            torch.randn(8000, generator=gen, dtype=torch.float64) * 0.1,
            torch.rand(8000, generator=gen) < 0.05,
        ),
    ):
        scores = scores.to(dtype)
        pos_scores = scores[positive].to(torch.float64)
        plan = plan_grid(
            float(scores.min()),
            float(scores.max()),
            float(pos_scores.min()),
            float(pos_scores.max()),
            scores.numel(),
            tau,
            tolerance,
            dtype,
            cache_tables=fast_binning.native_applicable(scores, None),
        )
        fast_sums = _forward_sums(scores, None, pos_scores, plan)[:4]
        names = ("R_A", "R_P", "D_A", "D_P")
        for name, got, want in zip(names, fast_sums, brute_force_sums(scores, positive, tau)):
            rel = float(((got - want).abs() / want).max())
            assert rel <= tolerance / 2, f"{name}: relative error {rel:.3g} > {tolerance / 2:g}"


@pytest.mark.parametrize("tau", [1e-2, 1e-3])
def test_kernel_sums_at_coarse_cell_edges(tau):
    # Worst case of the coarse expansion: the positive at one edge of its coarse cell,
    # all negatives at the opposite edge of a nearby cell (joint offset ~1 cell, the
    # largest the bound allows); the realised error is then close to the per-term bound.
    tolerance, m = 1e-8, 501
    h = plan_grid(-0.05, 0.05, 0.0, 0.0, m, tau, tolerance, torch.float64).h_coarse
    positive = torch.zeros(m, dtype=torch.bool)
    positive[0] = True
    for k in range(-4, 5):
        for query_edge in (-0.4999, 0.4999):
            for source_edge in (-0.4999, 0.4999):
                scores = torch.full((m,), (k + source_edge + 0.5) * h, dtype=torch.float64)
                scores[0] = (query_edge + 0.5) * h
                pos_scores = scores[:1]
                plan = plan_grid(
                    float(scores.min()),
                    float(scores.max()),
                    float(scores[0]),
                    float(scores[0]),
                    m,
                    tau,
                    tolerance,
                    torch.float64,
                    cache_tables=fast_binning.native_applicable(scores, None),
                )
                fast_sums = _forward_sums(scores, None, pos_scores, plan)[:4]
                for got, want in zip(fast_sums, brute_force_sums(scores, positive, tau)):
                    rel = float(((got - want).abs() / want).max())
                    assert rel <= tolerance / 2, f"cell offset {k}: relative error {rel:.3g}"


def window_edge_list(tau: float, tolerance: float, num_negatives: int = 4000):
    """One positive at 0 and every negative just below the lowest score the grid covers.

    The plan's window starts U τ below the lowest positive (rounded down to a coarse
    cell), U = log(4 M / (tolerance / 16)); items below it are dropped from every
    sum. Each contributes σ(−d/τ) ≈ e^(−U) to the exact R_A, so with the positive
    on top the relative error of R_A (and so of SAP) is ~2 M e^(−U) = tolerance / 32
    (less the rounding of the window edge).
    """
    m = num_negatives + 1
    plan = plan_grid(-1e6, 0.0, 0.0, 0.0, m, tau, tolerance, torch.float64)
    scores = torch.full((m,), plan.lo - 1e-3 * plan.h_coarse, dtype=torch.float64)
    scores[0] = 0.0
    positive = torch.zeros(m, dtype=torch.bool)
    positive[0] = True
    return scores, positive


@pytest.mark.parametrize("tolerance", [1e-4, 1e-8])
@pytest.mark.parametrize("tau", [1e-1, 1e-2, 1e-4])
def test_truncation_at_window_edge(tau, tolerance):
    scores, positive = window_edge_list(tau, tolerance)
    ref = reference(scores, positive, tau)
    # The case is a real test of the budget: the dropped mass is close to it.
    assert 1.0 - ref[0] >= tolerance / 100
    value, grad = fast(scores, positive, tau, tolerance)
    assert_within_contract(value, grad, ref, tolerance)
