"""The fast smoothed AP's accuracy contract, checked against a float64 brute force.

``rl_gap.losses.fast_sap.kernel`` states: every kernel sum (R_A, R_P, D_A, D_P, E_a,
E_b) has relative error <= tolerance/2, so |ΔSAP| <= tolerance. What that
implies for each output, to first order in the tolerance t:

- value: each term R_P/R_A of the mean is within t of itself (relative), so
  |ΔSAP| <= t · SAP (<= t, the headline bound).
- gradient, ``g_k = [E_b(s_k) + [k in P](E_a(s_k) − a_k D_P(k) − b_k D_A(k))] / (|P| τ)``
  with a = 1/R_A, b = −R_P/R_A²: the weights carry the ranks' errors (a: t/2,
  b: 3t/2), so E_a is within t, E_b within 2t, a·D_P within t, b·D_A within 2t,
  relative. E_b's weights all have one sign, so a negative's gradient is within
  2t of itself; a positive's is a difference of four terms and is bounded by
  2t times the sum of their magnitudes (the cancellation the kernel warns about).
- E at an item beyond every positive's band is truncated to 0: an absolute
  error <= sum_i (|a_i| + |b_i|) e^(−U) / (|P| τ) with e^(−U) = t / (64 M) (the
  plan's truncation budget t/16 = 4 M e^(−U)).

Plus rounding: float64 sums over the grid (FFT, M terms) at ~1e-16 relative to
the largest term, and for float32 outputs the cast of the value and of every
gradient entry (and the float32 Horner of the per-item polynomial).
"""

from __future__ import annotations

import torch

EPS64 = torch.finfo(torch.float64).eps
EPS32 = torch.finfo(torch.float32).eps


def reference(scores: torch.Tensor, positive: torch.Tensor, tau: float):
    """Float64 brute force: (SAP, gradient (M,), per-item bound scale S (M,), truncation unit).

    The truncation floor of the gradient bound is ``tolerance`` x the truncation unit
    ``sum_i (|a_i| + |b_i|) / (64 M |P| τ)``.

    SAP and its gradient come from autograd on the plain definition
    ``mean_i (1 + sum_{j in P, j != i} σ) / (1 + sum_{j != i} σ)``; S_k is the sum of
    the magnitudes of the terms of g_k above (checked to reproduce the gradient).
    """
    s = scores.detach().to(torch.float64).requires_grad_()
    pos_index = positive.nonzero().squeeze(1)
    num_pos = pos_index.numel()
    diff = (s.unsqueeze(0) - s[pos_index].unsqueeze(1)) / tau  # (P, M): (s_j − s_i)/τ
    sig = torch.sigmoid(diff)
    self_mask = torch.zeros_like(sig, dtype=torch.bool)
    self_mask[torch.arange(num_pos), pos_index] = True
    off = sig.masked_fill(self_mask, 0.0)
    rank_pos = 1.0 + off[:, pos_index].sum(1)
    rank_all = 1.0 + off.sum(1)
    sap = (rank_pos / rank_all).mean()
    (grad,) = torch.autograd.grad(sap, s)
    with torch.no_grad():
        dsig = sig * (1.0 - sig)  # σ'((s_k − s_i)/τ), symmetric in the sign
        rank_all, rank_pos = rank_all.detach(), rank_pos.detach()
        coef_a, coef_b = 1.0 / rank_all, -rank_pos / rank_all**2
        e_a = (coef_a.unsqueeze(1) * dsig).sum(0)  # (M,)
        e_b = (coef_b.unsqueeze(1) * dsig).sum(0)
        d_all, d_pos = dsig.sum(1), dsig[:, pos_index].sum(1)  # self term 1/4 included
        scale = 1.0 / (num_pos * tau)
        terms = [e_b.clone(), torch.zeros_like(e_b)]
        terms[1][pos_index] = e_a[pos_index] - coef_a * d_pos - coef_b * d_all
        decomposed = (terms[0] + terms[1]) * scale
        size = e_b.abs()
        size[pos_index] += e_a[pos_index].abs() + (coef_a * d_pos).abs() + (coef_b * d_all).abs()
        # The decomposition reproduces autograd's gradient (to rounding of its terms).
        assert bool(((decomposed - grad).abs() <= 1e-12 * size * scale + 1e-300).all())
        truncation = float((coef_a.abs() + coef_b.abs()).sum()) * scale / (64 * s.numel())
    return float(sap.detach()), grad, size * scale, truncation


def assert_within_contract(
    value: torch.Tensor,
    grad: torch.Tensor,
    ref,
    tolerance: float,
    out_dtype: torch.dtype = torch.float64,
) -> None:
    """Value and gradient of the fast kernel within the contract above (plus rounding)."""
    ref_value, ref_grad, size, truncation = ref
    eps = EPS64 if out_dtype == torch.float64 else EPS32
    value_err = abs(float(value.detach()) - ref_value)
    value_bound = (tolerance + 4 * eps) * abs(ref_value) + 1e-15
    assert value_err <= value_bound, f"|ΔSAP| = {value_err:.3g} > bound {value_bound:.3g}"
    grad = grad.detach().to(torch.float64)
    floor = 64 * EPS64 * float(size.max()) + tolerance * truncation
    bound = (2 * tolerance + 8 * eps) * size + floor
    err = (grad - ref_grad).abs()
    worst = int((err / bound).argmax())
    assert bool((err <= bound).all()), (
        f"gradient entry {worst}: error {float(err[worst]):.3g} > bound {float(bound[worst]):.3g}"
        f" (|g| = {float(ref_grad[worst].abs()):.3g}, ratio {float(err[worst] / bound[worst]):.2f})"
    )


def worst_ratio(value, grad, ref, tolerance: float) -> tuple[float, float]:
    """(|ΔSAP| / (tolerance SAP), max over k of |Δg_k| / (2 tolerance S_k + floor)): how much
    of the bound the kernel actually uses (float64 outputs)."""
    ref_value, ref_grad, size, truncation = ref
    floor = 64 * EPS64 * float(size.max()) + tolerance * truncation
    err = (grad.detach().to(torch.float64) - ref_grad).abs()
    return (
        abs(float(value.detach()) - ref_value) / (tolerance * ref_value),
        float((err / (2 * tolerance * size + floor)).max()),
    )
