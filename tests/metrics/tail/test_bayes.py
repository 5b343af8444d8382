"""The ``tail`` estimator and the paper's baselines against independent references.

References: brute-force AP@k over the whole list, scipy's negative binomial and
GPD densities, numpy's polyfit, and closed forms worked out by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rl_gap.metrics.tail import DEFAULT_ESTIMATOR, predict_map
from rl_gap.metrics.tail.baselines import fit_curve
from rl_gap.metrics.tail.bayes import (
    BayesTailConfig,
    gpd_posterior,
    profile_on_xi_grid,
    shape_integrated_survival,
)
from rl_gap.metrics.tail.rank_law import expected_precision
from tests.metrics.tail.test_from_scores import reference_ap_at_k

scipy_stats = pytest.importorskip("scipy.stats")
scipy_optimize = pytest.importorskip("scipy.optimize")


def small_world(seed: int, Q: int = 12, m: int = 4, S: int = 5000):
    g = torch.Generator().manual_seed(seed)
    neg = torch.randn(Q, S, generator=g, dtype=torch.float64)
    pos = 2.2 + 0.8 * torch.randn(Q, m, generator=g, dtype=torch.float64)
    n_pos = torch.randint(1, m + 1, (Q,), generator=g)
    pad = torch.arange(m).unsqueeze(0) >= n_pos.unsqueeze(1)
    return pos.masked_fill(pad, math.nan), neg


def test_default_estimator_is_tail_pooled():
    # Chosen on design families of worlds (docs/tail_validation.md, "Generated families").
    assert DEFAULT_ESTIMATOR == "tail_pooled"
    pos, neg = small_world(0, S=3000)
    est = predict_map(pos, neg, gallery_size=30_000, k=100, n_boot=20, score_range=None)
    assert est.estimator == "tail_pooled" and est.rank_law == "predictive"


@pytest.mark.parametrize("estimator", ["tail", "tail_pooled", "count", "sample", "single_x"])
def test_full_population_sampled_gives_exact_ap(estimator):
    """With the whole gallery as the sample (N = S) the estimators return its exact AP@k

    (``evt`` is not exact there by definition: it replaces counts below 5 by the fit)."""
    pos, neg = small_world(1)
    Q, S = neg.shape
    k = 60
    est = predict_map(
        pos, neg, gallery_size=S, k=k, estimator=estimator, n_boot=20, score_range=None
    )
    ref = []
    for q in range(Q):
        p = [float(v) for v in pos[q] if not math.isnan(v)]
        ref.append(reference_ap_at_k(p, neg[q].tolist(), k))
    if estimator == "single_x":
        # One shared hardness calibrated on the sample reproduces its mean exactly.
        assert est.map == pytest.approx(float(np.mean(ref)), abs=2e-4)
        return
    np.testing.assert_allclose(est.per_query.numpy(), np.array(ref), rtol=0, atol=1e-12)


def test_expected_precision_matches_scipy_negative_binomial():
    j = torch.tensor([1.0, 2.0, 3.0, 1.0], dtype=torch.float64)
    base = torch.tensor([0.0, 3.0, 1.0, 40.0], dtype=torch.float64)
    r = torch.tensor([5.0, 100.0, 2.5, 7.0], dtype=torch.float64)
    mean = torch.tensor([[0.5, 30.0], [2.0, 0.0], [12.0, 60.0], [1.0, 2.0]], dtype=torch.float64)
    mix = torch.tensor([[0.3, 0.7], [0.5, 0.5], [1.0, 0.0], [0.2, 0.8]], dtype=torch.float64)
    k = 50
    got = expected_precision(j, base, r, mean, mix, k)
    for i in range(4):
        want = 0.0
        for c in range(2):
            mu, rr = float(mean[i, c]), float(r[i])
            kk = np.arange(0, k + 1)
            pmf = (
                (kk == 0).astype(float)
                if mu == 0
                else scipy_stats.nbinom.pmf(kk, rr, rr / (rr + mu))
            )
            rank = float(j[i]) + float(base[i]) + kk
            want += float(mix[i, c]) * np.sum(np.where(rank <= k, float(j[i]) / rank, 0.0) * pmf)
        assert float(got[i]) == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_profile_likelihood_matches_scipy_along_theta():
    """Each grid point is the θ = ξ/σ whose best shape is ξ: the likelihood maximised over ξ
    at that θ (σ = ξ/θ), computed with scipy's GPD density, equals ours, at the same ξ."""
    g = np.random.default_rng(0)
    y = scipy_stats.genpareto.rvs(c=-0.2, scale=0.5, size=(2, 150), random_state=g)
    xi = torch.tensor([-0.45, -0.2, -0.05, 0.15], dtype=torch.float64)
    sigma, loglik = profile_on_xi_grid(torch.from_numpy(y), torch.ones(2, 150), xi)
    for q in range(2):
        for i, c0 in enumerate(xi.tolist()):
            theta = c0 / float(sigma[q, i])

            def nll(c, theta=theta, q=q):
                lp = scipy_stats.genpareto.logpdf(y[q], c=c, scale=c / theta)
                return 1e300 if not np.all(np.isfinite(lp)) else -lp.sum()

            bounds = (-3.0, -1e-9) if c0 < 0 else (1e-9, 3.0)
            res = scipy_optimize.minimize_scalar(
                nll, bounds=bounds, method="bounded", options={"xatol": 1e-10}
            )
            assert float(loglik[q, i]) == pytest.approx(-res.fun, abs=1e-6)
            assert res.x == pytest.approx(c0, abs=1e-4)


@pytest.mark.parametrize(
    "theta_scale,n_exc,prior",
    [
        (-0.6, 30, None),
        (0.8, 30, None),
        (-0.97, 12, None),
        (0.9, 12, None),
        (-0.6, 30, (-0.12, 0.04)),
    ],
)
def test_shape_integrated_survival_matches_numerical_integration(theta_scale, n_exc, prior):
    """At fixed θ, P(Y > y) averaged over ξ ∈ [xi_min, xi_max] under the GPD likelihood
    (σ = ξ/θ) times the prior on ξ (flat, or a normal), integrated numerically with
    scipy's density over the support only, equals the quadrature. The small-n cases
    put much of the likelihood outside the support (where the old closed form went)."""
    integrate = pytest.importorskip("scipy.integrate")
    xi_min, xi_max = -1.0, 0.5
    g = np.random.default_rng(1)
    y = scipy_stats.genpareto.rvs(c=-0.1, scale=1.0, size=n_exc, random_state=g)
    theta = theta_scale / y.max()
    xi_hat = float(np.mean(np.log1p(theta * y)))
    sign = -1.0 if theta < 0 else 1.0

    def logpost(c):
        lp = scipy_stats.genpareto.logpdf(y, c=c, scale=c / theta).sum()
        if prior is not None:
            lp -= 0.5 * ((c - prior[0]) / prior[1]) ** 2
        return lp

    peak = max(
        logpost(c) for c in np.linspace(*((xi_min, -1e-6) if sign < 0 else (1e-6, xi_max)), 400)
    )
    lo, hi = (xi_min, -1e-12) if sign < 0 else (1e-12, xi_max)
    pts = [min(max(xi_hat, lo), hi)]
    norm = integrate.quad(lambda c: math.exp(logpost(c) - peak), lo, hi, points=pts, limit=400)[0]
    far = 0.95 * (-1.0 / theta) if theta < 0 else 5.0 * y.max()  # inside the endpoint −1/θ
    for y0 in (0.5 * y.max(), min(1.2 * y.max(), far), far):
        want = integrate.quad(
            lambda c, y0=y0: math.exp(logpost(c) - peak) * (1 + theta * y0) ** (-1 / c),
            lo, hi, points=pts, limit=400,
        )[0] / norm  # fmt: skip
        got = shape_integrated_survival(
            torch.tensor(y0, dtype=torch.float64),
            torch.tensor(xi_hat / theta, dtype=torch.float64),
            torch.tensor(xi_hat, dtype=torch.float64),
            torch.tensor(float(n_exc), dtype=torch.float64),
            xi_min,
            xi_max,
            None if prior is None else prior[0],
            None if prior is None else prior[1],
        )
        assert float(got) == pytest.approx(want, rel=2e-3, abs=1e-12)


def test_posterior_concentrates_on_the_true_shape_and_reaches_beyond_the_endpoint():
    """Exact GPD tails: the ξ posterior sits near the truth; an unseen positive beyond
    the fitted endpoint keeps a non-zero hardness under ``tail`` (``evt`` calls it immune)."""
    g = torch.Generator().manual_seed(4)
    Q, S = 40, 20_000
    alpha = 4.0  # P(score ≥ s) = (1 − s)^α on [0, 1]: every tail is GPD with ξ = −1/α
    u = torch.rand(Q, S, generator=g, dtype=torch.float64)
    sample = 1.0 - u.pow(1.0 / alpha)
    top = torch.sort(sample, 1, descending=True).values[:, :4000]
    post = gpd_posterior(top, S, config=BayesTailConfig(n_excess=400, prior="flat"))
    assert float(post.xi_mean.mean()) == pytest.approx(-1.0 / alpha, abs=0.05)
    assert bool(post.ok.all())
    # A positive just below the true endpoint 1: beyond most fitted endpoints.
    pos = torch.full((Q, 1), 1.0 - 1e-4, dtype=torch.float64)
    tail = predict_map(pos, sample, gallery_size=20 * S, k=100, estimator="tail", n_boot=20)
    evt = predict_map(pos, sample, gallery_size=20 * S, k=100, estimator="evt", n_boot=20)
    assert bool((tail.hardness > 0).all())
    assert bool((evt.hardness == 0).any())


def test_curve_fits_recover_a_known_power_law_and_log_decay():
    sizes = torch.tensor([1000.0, 2000.0, 4000.0, 8000.0], dtype=torch.float64)
    a, b = 0.9, -0.15
    power = (a * sizes.pow(b)).unsqueeze(0)
    assert float(fit_curve(sizes, power, "powerlaw", 1e6)) == pytest.approx(a * 1e6**b, rel=1e-10)
    log_decay = (0.8 - 0.05 * torch.log(sizes)).unsqueeze(0)
    want = 0.8 - 0.05 * math.log(1e5)
    assert float(fit_curve(sizes, log_decay, "loguniform", 1e5)) == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError, match="unknown curve fit"):
        fit_curve(sizes, power, "cubic", 1e6)


def test_curve_fit_estimators_use_the_nested_sub_sample_metrics():
    pos, neg = small_world(2, Q=10, S=4000)
    Q, S, k, N = neg.shape[0], neg.shape[1], 50, 80_000
    sizes, maps = [], []
    # Nested levels are prefixes of the columns permuted with the seed (0).
    perm = torch.randperm(S, generator=torch.Generator().manual_seed(0))
    for f in (0.125, 0.25, 0.5, 1.0):
        n = int(round(f * S))
        aps = []
        for q in range(Q):
            p = [float(v) for v in pos[q] if not math.isnan(v)]
            aps.append(reference_ap_at_k(p, neg[q, perm[:n]].tolist(), k))
        sizes.append(n)
        maps.append(np.mean(aps))
    slope, icept = np.polyfit(np.log(sizes), np.log(maps), 1)
    est = predict_map(pos, neg, gallery_size=N, k=k, estimator="powerlaw", n_boot=50)
    assert est.map == pytest.approx(math.exp(icept + slope * math.log(N)), abs=1e-9)
    assert est.ci[0] <= est.ci[1] and bool(torch.isnan(est.per_query).all())
    slope, icept = np.polyfit(np.log(sizes), maps, 1)
    est = predict_map(pos, neg, gallery_size=N, k=k, estimator="loguniform", n_boot=50)
    assert est.map == pytest.approx(min(1.0, max(0.0, icept + slope * math.log(N))), abs=1e-9)


def test_single_x_matches_the_closed_form_for_single_positive_queries():
    """One positive per query: AP(λ) = 1/(1 + λ), so λ_S = 1/mAP_S − 1 and mAP_N = 1/(1 + λ_S·N/S)."""
    g = torch.Generator().manual_seed(3)
    Q, S, k, N = 30, 2000, 1000, 10_000
    neg = torch.randn(Q, S, generator=g, dtype=torch.float64)
    pos = (2.0 + 0.7 * torch.randn(Q, 1, generator=g, dtype=torch.float64)).clamp_max(4.0)
    measured = np.mean(
        [reference_ap_at_k([float(pos[q, 0])], neg[q].tolist(), k) for q in range(Q)]
    )
    lam = 1.0 / measured - 1.0
    want = 1.0 / (1.0 + lam * N / S)
    est = predict_map(pos, neg, gallery_size=N, k=k, estimator="single_x", n_boot=50)
    assert est.map == pytest.approx(want, rel=2e-3)
    assert est.ci[0] <= want <= est.ci[1]


def test_tiny_sample_warns():
    pos = torch.tensor([[0.5]], dtype=torch.float64)
    with pytest.warns(UserWarning, match="fewer than"):
        est = predict_map(pos, torch.tensor([[0.1]]), gallery_size=10, k=1000, estimator="count")
    assert est.map == 1.0


def test_predictive_rank_law_only_for_tail():
    pos, neg = small_world(5, Q=4, S=2000)
    with pytest.raises(ValueError, match="predictive"):
        predict_map(pos, neg, gallery_size=4000, k=50, estimator="evt", rank_law="predictive")
    with pytest.raises(ValueError, match="unknown rank_law"):
        predict_map(pos, neg, gallery_size=4000, k=50, rank_law="exact")
