"""Vectorised GPD profile-likelihood fit against scipy and closed-form checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import genpareto

from rl_gap.metrics.tail.gpd import fit_gpd, gpd_loglik, gpd_survival


def test_fit_matches_scipy_where_scipy_optimum_is_inside_the_bounds():
    rng = np.random.default_rng(0)
    shapes = [-0.05, -0.1, -0.2, -0.3, -0.4, -0.45]
    y = np.stack(
        [genpareto.rvs(c, scale=0.03, size=250, random_state=rng) for c in shapes for _ in range(3)]
    )
    fit = fit_gpd(torch.from_numpy(y))
    checked = 0
    for i in range(len(y)):
        c, loc, scale = genpareto.fit(y[i], floc=0)
        assert loc == 0
        if not -1.0 < c < 0.0:
            continue
        checked += 1
        ll_scipy = float(
            gpd_loglik(torch.from_numpy(y[i : i + 1]), torch.tensor([scale]), torch.tensor([c]))
        )
        # Same optimum: our likelihood is never worse, parameters agree.
        assert float(fit.loglik[i]) >= ll_scipy - 1e-6
        assert float(fit.xi[i]) == pytest.approx(c, abs=2e-3)
        assert float(fit.sigma[i]) == pytest.approx(scale, rel=2e-3)
        # The reported log-likelihood is the likelihood of the reported parameters.
        again = gpd_loglik(torch.from_numpy(y[i : i + 1]), fit.sigma[i : i + 1], fit.xi[i : i + 1])
        assert float(fit.loglik[i]) == pytest.approx(float(again), rel=1e-10)
    assert checked >= 12


def test_bounds_and_weights():
    rng = np.random.default_rng(1)
    heavy = genpareto.rvs(
        0.3, scale=1.0, size=400, random_state=rng
    )  # ξ > 0: clipped to the exponential
    exp_fit = fit_gpd(torch.from_numpy(heavy[None]))
    assert float(exp_fit.xi[0]) == 0.0
    assert float(exp_fit.sigma[0]) == pytest.approx(heavy.mean(), rel=1e-12)
    uniform = rng.uniform(0, 2.0, size=400)  # ξ = −1 boundary: uniform on [0, max]
    u_fit = fit_gpd(torch.from_numpy(uniform[None]))
    assert float(u_fit.xi[0]) == pytest.approx(-1.0, abs=0.02)
    assert float(u_fit.sigma[0]) == pytest.approx(uniform.max() * -float(u_fit.xi[0]), rel=0.02)
    # Integer weights equal repeating the excesses.
    y = genpareto.rvs(-0.2, scale=0.5, size=120, random_state=rng)
    w = rng.integers(0, 4, size=120)
    weighted = fit_gpd(torch.from_numpy(y[None]), torch.from_numpy(w[None]).double())
    repeated = fit_gpd(torch.from_numpy(np.repeat(y, w)[None]))
    assert float(weighted.xi[0]) == pytest.approx(float(repeated.xi[0]), abs=1e-6)
    assert float(weighted.sigma[0]) == pytest.approx(float(repeated.sigma[0]), rel=1e-6)


def test_degenerate_rows_are_flagged():
    y = torch.tensor(
        [[0.0] * 50, [0.1] * 5 + [math.nan] * 45, list(np.linspace(0.01, 1, 50))],
        dtype=torch.float64,
    )
    fit = fit_gpd(y)
    assert fit.ok.tolist() == [False, False, True]
    assert math.isnan(float(fit.xi[0])) and math.isfinite(float(fit.xi[2]))
    with pytest.raises(ValueError, match="non-negative"):
        fit_gpd(-torch.ones(2, 20))


def test_survival_closed_form():
    y = torch.tensor([0.0, 0.5, 1.0, 3.0], dtype=torch.float64)
    s = gpd_survival(
        y, torch.tensor(1.0, dtype=torch.float64), torch.tensor(-0.5, dtype=torch.float64)
    )
    expected = [(1 - 0.5 * v) ** 2 if v < 2 else 0.0 for v in y.tolist()]
    assert s.tolist() == pytest.approx(expected, abs=1e-15)
    s0 = gpd_survival(
        y, torch.tensor(2.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)
    )
    assert s0.tolist() == pytest.approx([math.exp(-v / 2) for v in y.tolist()], rel=1e-14)
