"""Tail extrapolation: rank map exactness, estimators, intervals, input checks.

References are written plainly in float64 here (brute-force ranks), never the
code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rl_gap.metrics.tail import predict_map
from rl_gap.metrics.tail.hardness import fit_tail, sample_counts
from rl_gap.metrics.tail.rank_law import ap_at_k_from_hardness, sort_positives


def reference_ap_at_k(pos: list[float], neg: list[float], k: int) -> float:
    """Exact AP@k with pessimistic ties, by brute force over the whole list."""
    items = list(pos) + list(neg)
    total = 0.0
    for s in pos:
        rank = sum(1 for a in items if a >= s)
        if rank <= k:
            total += sum(1 for p in pos if p >= s) / rank
    return total / min(k, len(pos))


def tied_gallery(seed: int, Q: int = 25, m: int = 6, N: int = 150):
    """Scores on a coarse grid, so positives tie with each other and with distractors."""
    g = torch.Generator().manual_seed(seed)
    neg = torch.randint(0, 40, (Q, N), generator=g).double() / 8.0
    pos = torch.randint(10, 48, (Q, m), generator=g).double() / 8.0
    n_pos = torch.randint(0, m + 1, (Q,), generator=g)
    n_pos[0] = m
    n_pos[1] = 0  # a query without positives
    pad = torch.arange(m).unsqueeze(0) >= n_pos.unsqueeze(1)
    return pos.masked_fill(pad, math.nan), neg


@pytest.mark.filterwarnings("ignore:the distractor sample has")  # k = 1000 > S on purpose
@pytest.mark.parametrize("k", [1, 3, 10, 40, 1000])
def test_realized_fractions_reproduce_gallery_ap_exactly(k):
    pos, neg = tied_gallery(seed=k)
    Q, N = neg.shape
    pos_sorted, valid, j = sort_positives(pos)
    # Realized fractions K_j / N, counted plainly.
    K = (neg.unsqueeze(1) >= pos_sorted.unsqueeze(2)).sum(-1).double()
    ap = ap_at_k_from_hardness(j, valid, K / N, N, k)
    for q in range(Q):
        p = [float(v) for v in pos[q] if not math.isnan(v)]
        if not p:
            assert math.isnan(float(ap[q]))
            continue
        assert float(ap[q]) == pytest.approx(reference_ap_at_k(p, neg[q].tolist(), k), abs=1e-12)

    # The `sample` estimator is the same map fed by the sample itself (N = S).
    est = predict_map(pos, neg, gallery_size=N, k=k, estimator="sample", n_boot=50)
    torch.testing.assert_close(est.per_query, ap, equal_nan=True, rtol=0, atol=1e-12)
    n_empty = int(torch.isnan(pos).all(1).sum())
    assert n_empty >= 1 and est.n_excluded == n_empty and est.n_queries == Q - n_empty


def test_sample_estimator_matches_metric_engine():
    functional = pytest.importorskip("rl_gap.metrics.functional")
    if not hasattr(functional, "mean_ap"):
        pytest.skip("metric engine not available")
    pos, neg = tied_gallery(seed=7)
    scores = torch.cat([torch.nan_to_num(pos, nan=-1.0), neg], dim=1)
    rel = torch.zeros_like(scores, dtype=torch.bool)
    rel[:, : pos.shape[1]] = ~torch.isnan(pos)
    valid = torch.ones_like(rel)
    valid[:, : pos.shape[1]] = ~torch.isnan(pos)
    for k in (1, 5, 50):
        engine = functional.mean_ap(scores, rel, valid, k=k)
        est = predict_map(pos, neg, gallery_size=neg.shape[1], k=k, estimator="sample", n_boot=10)
        assert est.map == pytest.approx(float(engine), abs=1e-12)


def test_expected_ap_matches_simulated_galleries():
    """E[AP@k] under the Binomial law equals the average realized AP@k of simulated galleries."""
    g = torch.Generator().manual_seed(0)
    N, k, R = 400, 20, 6000
    # Distractors ~ U(0, 1): the hardness of a positive scoring s is exactly 1 − s.
    pos = torch.tensor(
        [[0.999, 0.99, 0.97, 0.95], [0.995, 0.9, math.nan, math.nan]], dtype=torch.float64
    )
    pos_sorted, valid, j = sort_positives(pos)
    x = torch.where(valid, 1.0 - pos_sorted, torch.zeros_like(pos_sorted))
    exact = ap_at_k_from_hardness(j, valid, x, N, k, "binomial")
    draws = torch.rand(R, N, generator=g, dtype=torch.float64)
    for q in range(2):
        p = pos[q][~torch.isnan(pos[q])]
        K = (draws.unsqueeze(1) >= p.view(1, -1, 1)).sum(-1).double()  # (R, m): coupled counts
        jj = torch.arange(1, p.numel() + 1, dtype=torch.float64)
        rank = jj + K
        ap = torch.where(rank <= k, jj / rank, torch.zeros_like(rank)).sum(1) / min(k, p.numel())
        se = float(ap.std()) / math.sqrt(R)
        assert float(exact[q]) == pytest.approx(float(ap.mean()), abs=4 * se + 1e-4)
    # Plug-in expected ranks differ from E[AP@k] (Jensen), Poisson ≈ Binomial for small x.
    plugin = ap_at_k_from_hardness(j, valid, x, N, k, "plugin")
    assert not torch.allclose(plugin, exact, atol=1e-3)
    big = ap_at_k_from_hardness(j, valid, x / 1000, N * 1000, k, "binomial")
    poisson = ap_at_k_from_hardness(j, valid, x / 1000, N * 1000, k, "poisson")
    torch.testing.assert_close(big, poisson, atol=2e-4, rtol=0)


def test_counts_and_saturation():
    top = torch.tensor(
        [[5.0, 4.0, 4.0, 2.0], [3.0, -math.inf, -math.inf, -math.inf]], dtype=torch.float64
    )
    pos = torch.tensor([[6.0, 4.0, 1.0], [3.0, 0.0, math.nan]], dtype=torch.float64)
    valid = ~torch.isnan(pos)
    counts, saturated = sample_counts(pos, valid, top)
    assert counts.tolist() == [[0.0, 3.0, 4.0], [1.0, 1.0, 0.0]]
    assert saturated.tolist() == [[False, False, True], [False, False, False]]
    w = torch.tensor([[2.0, 0.0, 1.0, 1.0], [3.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    counts_w, _ = sample_counts(pos, valid, top, w)
    assert counts_w.tolist() == [[0.0, 3.0, 4.0], [3.0, 3.0, 0.0]]


def exact_gpd_tail_sample(Q: int, S: int, alpha: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Scores on [0, 1] with P(score ≥ s) = (1 − s)^α: every tail is exactly GPD(ξ = −1/α)."""
    u = torch.rand(Q, S, generator=g, dtype=torch.float64)
    return 1.0 - u.pow(1.0 / alpha.unsqueeze(1))


def test_evt_recovers_closed_form_hardness_and_count_gives_zero():
    g = torch.Generator().manual_seed(1)
    Q, S = 200, 40_000
    alpha = torch.linspace(3.0, 6.0, Q, dtype=torch.float64)
    sample = exact_gpd_tail_sample(Q, S, alpha, g)
    # Positives whose true hardness is below 1/S: mostly unseen by the sample.
    x_true = torch.stack([torch.full((Q,), 1e-5), torch.full((Q,), 4e-5)], 1).double()
    pos = 1.0 - x_true.pow(1.0 / alpha.unsqueeze(1))
    N = 20 * S
    est = predict_map(pos, sample, gallery_size=N, k=1000, estimator="evt", n_boot=100)
    assert bool(est.tail_ok.all())
    xi_err = est.fit.xi + 1.0 / alpha
    assert abs(float(xi_err.mean())) < 0.04 and float(xi_err.std()) < 0.12
    # Per positive the extrapolation is noisy (~200 excesses, 100-500x beyond
    # the threshold's exceedance rate) but unbiased on average over queries.
    ratio = est.hardness / x_true  # columns already in descending score order
    assert float(ratio.mean()) == pytest.approx(1.0, abs=0.3)
    assert 0.5 < float(ratio.median()) < 1.5
    assert float((ratio == 0).double().mean()) < 0.15  # endpoint below s_j: "immune"

    count = predict_map(pos, sample, gallery_size=N, k=1000, estimator="count", n_boot=100)
    reached = (sample.unsqueeze(1) >= pos.unsqueeze(2)).any(-1)
    assert bool((count.hardness[~reached] == 0).all())
    assert not bool(reached.all())
    # With x = 0 every such positive keeps rank j: count over-predicts here.
    assert count.map > est.map
    # The truth at N from the closed-form hardness (plug-in map, float64 by hand).
    xs = x_true
    r = torch.tensor([1.0, 2.0]) + N * xs
    truth = (
        torch.where(r <= 1000, torch.tensor([1.0, 2.0]) / r, torch.zeros_like(r)).sum(1).mean() / 2
    )
    # prec = j/(j + N·x) is convex in x, so unbiased-but-noisy x̂ over-predicts
    # when every positive sits at N·x = O(10); still far closer than counting.
    assert count.map - float(truth) > 0.4
    assert abs(est.map - float(truth)) < (count.map - float(truth)) / 3
    assert est.ci[0] <= est.map <= est.ci[1]


def test_degenerate_tails_fall_back_to_counting_and_are_flagged():
    g = torch.Generator().manual_seed(3)
    Q, S = 4, 6000
    sample = torch.randn(Q, S, generator=g, dtype=torch.float64)
    sample[1] = 0.25  # constant scores: no excess over the threshold
    sample[2, :] = torch.round(sample[2] * 2) / 2  # few distinct values
    pos = torch.tensor([[5.0], [5.0], [5.0], [5.0]], dtype=torch.float64)
    est = predict_map(pos, sample, gallery_size=10 * S, k=100, estimator="evt", n_boot=20)
    assert bool(est.tail_ok[0]) and not bool(est.tail_ok[1])
    assert float(est.hardness[1, 0]) == 0.0  # counting: nothing reaches 5.0
    fit = fit_tail(torch.sort(sample, 1, descending=True).values[:, :4000], S)
    assert not bool(fit.ok[1])


def test_bootstrap_interval_and_nested_bootstrap_and_budget():
    g = torch.Generator().manual_seed(5)
    Q, S = 60, 12_000
    sample = torch.randn(Q, S, generator=g)
    pos = torch.randn(Q, 3, generator=g) * 0.5 + 3.4
    est = predict_map(
        pos,
        sample,
        gallery_size=10 * S,
        k=100,
        estimator="evt",
        n_boot=1000,
        nested_boot=4,
        budget=True,
    )
    pq = est.per_query.numpy()
    rng = np.random.default_rng(0)
    means = np.array([pq[rng.integers(0, Q, Q)].mean() for _ in range(2000)])
    lo, hi = np.quantile(means, [0.025, 0.975])
    assert est.ci[0] == pytest.approx(lo, abs=0.01) and est.ci[1] == pytest.approx(hi, abs=0.01)
    assert est.nested_ci[1] - est.nested_ci[0] >= 0.5 * (est.ci[1] - est.ci[0])
    assert est.sample_noise_sd > 0
    levels = est.budget["levels"]
    assert [lv["sample_size"] for lv in levels] == [S // 4, S // 2, S]
    spread = max(lv["map"] for lv in levels) - min(lv["map"] for lv in levels)
    assert est.budget["converged"] == (spread <= est.budget["noise"])
    assert levels[-1]["map"] == pytest.approx(est.map)


def test_bad_inputs_raise_clear_errors():
    pos = torch.full((3, 2), 0.9)
    sample = torch.rand(3, 50)
    with pytest.raises(ValueError, match="NaN or"):
        bad = sample.clone()
        bad[0, 3] = math.nan
        predict_map(pos, bad, gallery_size=100, k=10)
    with pytest.raises(ValueError, match="inf"):
        predict_map(pos.masked_fill(pos > 0, math.inf), sample, gallery_size=100, k=10)
    with pytest.raises(ValueError, match="gallery_size"):
        predict_map(pos, sample, gallery_size=10, k=10)
    with pytest.raises(ValueError, match="k must be"):
        predict_map(pos, sample, gallery_size=100, k=0)
    with pytest.raises(ValueError, match="estimator"):
        predict_map(pos, sample, gallery_size=100, k=10, estimator="magic")
    with pytest.raises(ValueError, match="queries"):
        predict_map(pos, torch.rand(4, 50), gallery_size=100, k=10)
    with pytest.raises(ValueError, match="no query has a positive"):
        predict_map(torch.full((3, 2), math.nan), sample, gallery_size=100, k=10, estimator="count")
    with pytest.warns(UserWarning, match="smaller than"):
        est = predict_map(pos, sample, gallery_size=100, k=10, estimator="evt", n_boot=10)
    assert not bool(est.tail_ok.any())  # 50 samples: too few exceedances, counting
