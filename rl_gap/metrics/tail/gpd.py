"""Generalized Pareto tail fit, vectorised over queries (profile likelihood).

The tail-aware (EVT) estimator of *Web Scale on a Budget* (App. B) fits a
generalized Pareto distribution (GPD) with shape ξ ∈ [−1, 0] and scale σ to
the excesses ``y = s − u > 0`` of each query's distractor scores over a high
threshold ``u``. The GPD survival function is
``P(Y > y) = (1 + ξ y / σ)^(−1/ξ)`` (``exp(−y/σ)`` at ξ = 0), with a finite
endpoint ``−σ/ξ`` when ξ < 0 (cosine scores are bounded).

Why not ``scipy.stats.genpareto.fit``: maximum likelihood is non-regular for
ξ < −0.5 and unbounded for ξ < −1, and bounded quasi-Newton optimisers were
seen stalling far from the optimum. Re-parametrising with θ = ξ/σ gives, for
fixed θ, the closed-form maximiser ``ξ̂(θ) = mean log1p(θ·y)``,
``σ̂(θ) = ξ̂/θ`` and the profile log-likelihood
``ℓ(θ) = −n·(log σ̂(θ) + ξ̂(θ) + 1)``: a one-dimensional problem that is
solved for all queries at once (grid over θ, then nested local grids around
the best point).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class GPDFit:
    """Per-query GPD parameters (all shape (Q,), float64).

    Attributes:
        sigma: scale σ > 0.
        xi: shape ξ ∈ [xi_min, 0].
        loglik: maximised log-likelihood of the (weighted) excesses.
        n: (weighted) number of excesses used.
        ok: False where the fit is degenerate (too few excesses, all excesses
            zero); callers fall back to counting there.
    """

    sigma: torch.Tensor
    xi: torch.Tensor
    loglik: torch.Tensor
    n: torch.Tensor
    ok: torch.Tensor


def gpd_survival(y: torch.Tensor, sigma: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:
    """GPD survival ``P(Y ≥ y)`` for excess ``y ≥ 0`` (broadcasting).

    Zero beyond the endpoint ``−σ/ξ`` when ξ < 0; ``exp(−y/σ)`` where ξ = 0.
    """
    z = xi * y / sigma
    inside = 1.0 + z
    safe_xi = torch.where(xi == 0, torch.ones_like(xi), xi)
    power = torch.exp(-torch.log(inside.clamp_min(1e-300)) / safe_xi)
    out = torch.where(xi == 0, torch.exp(-y / sigma), power)
    return torch.where(inside > 0, out, torch.zeros_like(out))


def _profile(
    t: torch.Tensor, y_scaled: torch.Tensor, w: torch.Tensor, wsum: torch.Tensor, ymax: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Profile log-likelihood at scaled θ: ``t = θ·ymax`` ∈ (−1, 0), shape (Q, G).

    Returns (loglik, xi, sigma), each (Q, G).
    """
    # log1p(θ y) = log1p(t · y/ymax); (Q, G, n) is small: n ≈ 200 excesses.
    logs = torch.log1p(t.unsqueeze(-1) * y_scaled.unsqueeze(1))
    xi = (logs * w.unsqueeze(1)).sum(-1) / wsum.unsqueeze(1)
    sigma = xi * ymax.unsqueeze(1) / t
    loglik = -wsum.unsqueeze(1) * (torch.log(sigma) + xi + 1.0)
    return loglik, xi, sigma


def fit_gpd(
    excess: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    xi_min: float = -1.0,
    min_excesses: float = 10.0,
    grid_size: int = 40,
    refine_rounds: int = 2,
    refine_points: int = 24,
) -> GPDFit:
    """Maximum-likelihood GPD fit with ξ ∈ [xi_min, 0], one fit per row.

    Args:
        excess: (Q, n) excesses over the threshold, ≥ 0; entries whose weight is
            0 (or NaN entries) are padding.
        weight: optional (Q, n) non-negative weights (e.g. bootstrap
            multiplicities); default 1 for every finite entry.
        xi_min: lower bound on ξ (−1: the likelihood is unbounded below it).
        min_excesses: rows with fewer (weighted) excesses are flagged not ok.
        grid_size: θ grid points before refinement.
        refine_rounds: rounds of local grid refinement around the best grid point.
        refine_points: points per refinement round.

    Returns:
        GPDFit with (Q,) float64 tensors.
    """
    if excess.dim() != 2:
        raise ValueError(f"excess must be (Q, n), got shape {tuple(excess.shape)}")
    if not -1.0 <= xi_min <= 0.0:
        raise ValueError(f"xi_min must lie in [-1, 0], got {xi_min}")
    rows = _Rows.of(excess, weight, min_excesses)
    best_ll, best_xi, best_sigma = _boundary_candidates(rows, xi_min)
    ll_in, xi_in, sigma_in = _interior_candidate(
        rows, xi_min, grid_size, refine_rounds, refine_points
    )
    take = ll_in > best_ll
    best_ll = torch.where(take, ll_in, best_ll)
    best_xi = torch.where(take, xi_in, best_xi)
    best_sigma = torch.where(take, sigma_in, best_sigma)
    ok = rows.ok
    nan = torch.full_like(best_ll, math.nan)
    return GPDFit(
        sigma=torch.where(ok, best_sigma, nan),
        xi=torch.where(ok, best_xi, nan),
        loglik=torch.where(ok, best_ll, nan),
        n=rows.wsum,
        ok=ok,
    )


@dataclass
class _Rows:
    """Each row's excesses in units of its largest (``y_scaled`` ∈ [0, 1]) with weights;
    degenerate rows (too few excesses, all zero) get a harmless stand-in so the
    vectorised maths stays finite."""

    ok: torch.Tensor
    wsum: torch.Tensor
    w_safe: torch.Tensor
    wsum_safe: torch.Tensor
    ymax_safe: torch.Tensor
    y_scaled: torch.Tensor
    mean_y: torch.Tensor

    @classmethod
    def of(cls, excess: torch.Tensor, weight: torch.Tensor | None, min_excesses: float) -> _Rows:
        y = excess.to(torch.float64)
        finite = torch.isfinite(y)
        w = torch.ones_like(y) if weight is None else weight.to(torch.float64).clone()
        w = torch.where(finite, w, torch.zeros_like(w))
        y = torch.where(finite, y, torch.zeros_like(y))
        if bool((y < 0).any()):
            raise ValueError("GPD excesses must be non-negative")
        wsum = w.sum(-1)
        ymax = torch.where(w > 0, y, torch.zeros_like(y)).amax(-1)
        ok = (wsum >= min_excesses) & (ymax > 0)
        ymax_safe = torch.where(ok, ymax, torch.ones_like(ymax))
        wsum_safe = torch.where(ok, wsum, torch.ones_like(wsum))
        w_safe = torch.where(ok.unsqueeze(-1), w, torch.ones_like(w))
        y_scaled = torch.where(
            ok.unsqueeze(-1), y / ymax_safe.unsqueeze(-1), torch.full_like(y, 0.5)
        )
        mean_y = (w_safe * y_scaled).sum(-1) / wsum_safe * ymax_safe
        return cls(ok, wsum, w_safe, wsum_safe, ymax_safe, y_scaled, mean_y)


def _boundary_candidates(rows: _Rows, xi_min: float):
    """(loglik, ξ, σ) of the better of ξ = 0 (exponential, σ = mean excess) and, when
    allowed, ξ = −1 (uniform on [0, σ], σ = max excess)."""
    best_ll = -rows.wsum_safe * (torch.log(rows.mean_y) + 1.0)
    best_xi = torch.zeros(rows.ok.shape[0], dtype=torch.float64)
    best_sigma = rows.mean_y.clone()
    if xi_min <= -1.0:
        ll_uniform = -rows.wsum_safe * torch.log(rows.ymax_safe)
        take = ll_uniform > best_ll
        best_ll = torch.where(take, ll_uniform, best_ll)
        best_xi = torch.where(take, torch.full_like(best_xi, -1.0), best_xi)
        best_sigma = torch.where(take, rows.ymax_safe, best_sigma)
    return best_ll, best_xi, best_sigma


def _interior_candidate(
    rows: _Rows, xi_min: float, grid_size: int, refine_rounds: int, refine_points: int
):
    """(loglik, ξ, σ) of the best interior point of the θ path: scaled t = θ·ymax ∈ (−1, 0)
    on a grid (denser near the pole t = −1, where the profile is steep), nested local
    grids around its best point, then Newton steps (:func:`_polish`)."""
    Q = rows.ok.shape[0]
    uniform = torch.linspace(-1.0, 0.0, grid_size + 1, dtype=torch.float64)[1:-1]
    near_pole = -1.0 + torch.logspace(-6, -2, 9, dtype=torch.float64)
    grid = torch.sort(torch.cat([near_pole, uniform])).values
    grid_q = grid.unsqueeze(0).expand(Q, -1)
    fit_args = (rows.y_scaled, rows.w_safe, rows.wsum_safe, rows.ymax_safe)

    def feasible_loglik(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ll, xi, sigma = _profile(t, *fit_args)
        ll = torch.where((xi >= xi_min) & torch.isfinite(ll), ll, torch.full_like(ll, -math.inf))
        return ll, xi, sigma

    # The grid only brackets the maximum: float32 halves its cost; refinement is float64.
    ll_grid, xi_grid, _ = _profile(grid_q.float(), *(a.float() for a in fit_args))
    ll_grid = torch.where(
        (xi_grid >= xi_min) & torch.isfinite(ll_grid), ll_grid, torch.full_like(ll_grid, -math.inf)
    )
    i_best = ll_grid.argmax(-1)
    padded = torch.cat([grid.new_tensor([-1.0]), grid, grid.new_tensor([-1e-12])])
    lo = padded[i_best]  # neighbour left of the best grid point (padded index shift)
    hi = padded[i_best + 2]
    # Nested local grids on [lo, hi], all rows at once: each round keeps the
    # neighbours of its best point (width × 2/(P−1)). Few, large tensor ops
    # (rather than many small sequential steps) stay fast on busy CPUs.
    frac = torch.linspace(0.0, 1.0, refine_points, dtype=torch.float64)
    t_ref = grid[i_best]
    bracket = (lo, hi)
    for _ in range(refine_rounds):
        ts = lo.unsqueeze(1) + (hi - lo).unsqueeze(1) * frac
        ll = feasible_loglik(ts)[0]
        i = ll.argmax(-1, keepdim=True)
        t_ref = ts.gather(1, i).squeeze(1)
        lo = ts.gather(1, (i - 1).clamp_min(0)).squeeze(1)
        hi = ts.gather(1, (i + 1).clamp_max(refine_points - 1)).squeeze(1)
    t_ref = _polish(t_ref, *bracket, rows.y_scaled, rows.w_safe, rows.wsum_safe)
    # Keep the best of the refined point and the best grid point.
    t_all = torch.stack([t_ref, grid[i_best]], dim=-1)
    ll_all, xi_all, sigma_all = feasible_loglik(t_all)
    j = ll_all.argmax(-1, keepdim=True)
    pick = lambda x: x.gather(-1, j).squeeze(-1)  # noqa: E731
    return pick(ll_all), pick(xi_all), pick(sigma_all)


def _polish(
    t: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
    y: torch.Tensor,
    w: torch.Tensor,
    wsum: torch.Tensor,
    steps: int = 4,
) -> torch.Tensor:
    """Newton steps on the profile score dℓ/dt = 0 inside the grid's bracket [lo, hi].

    The profile is flat at its maximum, so a grid pins t only to ~1e-7 (where ℓ's
    rounding hides the slope); its score equation is well conditioned, so the
    fitted ξ is then reproducible to rounding, whatever the score scale.
    """
    for _ in range(steps):
        ty = 1.0 + t.unsqueeze(1) * y
        d1 = (w * y / ty).sum(1) / wsum  # dξ̂/dt
        d2 = -(w * (y / ty) ** 2).sum(1) / wsum
        xi = (w * torch.log(ty)).sum(1) / wsum
        score = d1 * (1.0 / xi + 1.0) - 1.0 / t
        slope = d2 * (1.0 / xi + 1.0) - (d1 / xi) ** 2 + 1.0 / t**2
        step = t - score / slope
        usable = torch.isfinite(step) & (step >= lo) & (step <= hi) & (xi < 0)
        t = torch.where(usable, step, t)
    return t


def gpd_loglik(excess: torch.Tensor, sigma: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:
    """Log-likelihood of (Q, n) excesses under per-row GPD (σ, ξ) (unweighted, for checks)."""
    y = excess.to(torch.float64)
    sigma = sigma.to(torch.float64).unsqueeze(-1)
    xi = xi.to(torch.float64).unsqueeze(-1)
    z = 1.0 + xi * y / sigma
    safe_xi = torch.where(xi == 0, torch.ones_like(xi), xi)
    term = torch.where(xi == 0, y / sigma, (1.0 / safe_xi + 1.0) * torch.log(z.clamp_min(1e-300)))
    # ξ = −1 is the uniform law on [0, σ]: the log term's factor vanishes, endpoint included.
    term = torch.where(xi == -1, torch.zeros_like(term), term)
    z = torch.where((xi == -1) & (y <= sigma), torch.ones_like(z), z)
    ll = -torch.log(sigma) - term
    ll = torch.where(z > 0, ll, torch.full_like(ll, -math.inf))
    return ll.sum(-1)


def _xi_hat(t: torch.Tensor, y: torch.Tensor, w: torch.Tensor, wsum: torch.Tensor) -> torch.Tensor:
    """ξ̂(t) = weighted mean of log1p(t·y) per row; t (Q, G), y and w (Q, n)."""
    logs = torch.log1p(t.unsqueeze(-1) * y.unsqueeze(1))
    return (logs * w.unsqueeze(1)).sum(-1) / wsum.unsqueeze(1)


def profile_on_xi_grid(
    excess: torch.Tensor,
    weight: torch.Tensor,
    xi_grid: torch.Tensor,
    bisections: int = 12,
    newton_steps: int = 6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPD likelihood along the θ-profile, at the θ whose best shape is each grid ξ.

    With θ = ξ/σ (= −1/endpoint for ξ < 0), for fixed θ the likelihood is
    maximised by ``ξ̂(θ) = mean log1p(θ·y)``, an increasing function of θ, so
    the profile over θ can be indexed by ξ = ξ̂(θ). For each grid ξ
    the θ with ξ̂(θ) = ξ is found by bisection then Newton steps (in t = θ·max y), and
    ``σ = ξ/θ``, ``ℓ = −n (log σ + ξ + 1)``.

    Args:
        excess: (Q, n) excesses ≥ 0 (entries with weight 0 are padding).
        weight: (Q, n) non-negative weights; rows need a positive max excess.
        xi_grid: (G,) shapes, none exactly 0.
        bisections, newton_steps: root-finding steps.

    Returns:
        sigma (Q, G) and loglik (Q, G), float64.
    """
    y = excess.to(torch.float64)
    w = weight.to(torch.float64)
    ymax = torch.where(w > 0, y, torch.zeros_like(y)).amax(1).clamp_min(1e-300)
    ys = (y / ymax.unsqueeze(1)).clamp(0.0, 1.0)
    wsum = w.sum(1).clamp_min(1e-300)
    ybar = ((ys * w).sum(1) / wsum).clamp(1e-12, 1.0)
    Q, G = y.shape[0], xi_grid.numel()
    xi = xi_grid.to(torch.float64).unsqueeze(0).expand(Q, G)
    # Brackets from concavity of y ↦ log1p(t·y) on [0, 1]: y·log1p(t) ≤ log1p(t·y) ≤ t·y.
    neg = xi < 0
    ratio = xi / ybar.unsqueeze(1)
    lo = torch.where(neg, ratio.clamp_min(-1.0 + 1e-15), torch.expm1(xi))
    hi = torch.where(neg, torch.expm1(ratio).clamp(max=-1e-300), torch.expm1(ratio.clamp(max=700)))
    # Bisection in log1p(t): geometric near the pole t = −1, where roots of very negative ξ sit.
    lo, hi = torch.log1p(lo), torch.log1p(hi)
    for _ in range(bisections):
        mid = 0.5 * (lo + hi)
        below = _xi_hat(torch.expm1(mid), ys, w, wsum) < xi
        lo = torch.where(below, mid, lo)
        hi = torch.where(below, hi, mid)
    lo, hi = torch.expm1(lo), torch.expm1(hi)
    # ξ̂ is concave and increasing in t: Newton from the left end of the
    # bracket converges monotonically from below, never overshooting.
    t, floor = lo, lo
    for _ in range(newton_steps):
        step_t = t.unsqueeze(-1) * ys.unsqueeze(1)
        value = (torch.log1p(step_t) * w.unsqueeze(1)).sum(-1) / wsum.unsqueeze(1)
        slope = (ys.unsqueeze(1) / (1.0 + step_t) * w.unsqueeze(1)).sum(-1) / wsum.unsqueeze(1)
        newton = torch.clamp(t - (value - xi) / slope.clamp_min(1e-300), floor, hi)
        # At t = −1 (root next to the pole) ξ̂ is −inf: bisect towards hi instead.
        t = torch.where(torch.isfinite(value), newton, 0.5 * (t + hi))
    xi_t = _xi_hat(t, ys, w, wsum)
    sigma = xi_t * ymax.unsqueeze(1) / t
    loglik = -wsum.unsqueeze(1) * (torch.log(sigma) + xi_t + 1.0)
    usable = torch.isfinite(loglik) & (sigma > 0)
    # A shape the data cannot reach (ξ̂ → −inf at the pole) has zero likelihood.
    return torch.where(usable, sigma, 1.0), torch.where(usable, loglik, -math.inf)


def capped_excesses(n_excess: int, n_sample: int, kept: int) -> int:
    """Exceedances a fit of ``n_excess`` takes: fewer than the sample and the ``kept`` top
    scores (a threshold must remain below them), at least one."""
    return max(1, min(int(n_excess), n_sample - 1, kept - 1))


def largest_excess(excess: torch.Tensor, w_exc: torch.Tensor) -> torch.Tensor:
    """(Q,) each query's largest weighted excess (0 where it has none)."""
    return torch.where(w_exc > 0, excess, torch.zeros_like(excess)).amax(1)


def with_stand_in(
    excess: torch.Tensor, w_exc: torch.Tensor, ok: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(excess, weights) with the rows not ``ok`` replaced by a harmless stand-in (a
    decreasing ramp, unit weights), so that the vectorised fit stays finite on them."""
    stand_in = torch.linspace(1.0, 0.01, excess.shape[1], dtype=torch.float64).unsqueeze(0)
    y = torch.where(ok.unsqueeze(1), excess, stand_in.expand_as(excess))
    return y, torch.where(ok.unsqueeze(1), w_exc, torch.ones_like(w_exc))
