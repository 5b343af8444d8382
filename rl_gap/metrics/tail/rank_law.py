"""The hardness-to-metric map: per-positive hardness x_j → AP@k at gallery size N.

*Web Scale on a Budget* (§3, App. A): positive j of a query (positives sorted
by score, descending) is outranked by K_j ~ Binomial(N, x_j) distractors of a
size-N gallery, x_j being the fraction of the distractor population scoring
≥ s_j. Ties are pessimistic (docs/definitions.md): ``rank(j)`` counts every item with
score ≥ s_j, so ``j`` below is the number of positives scoring ≥ s_j (a tie
group of positives shares the largest index of the group) and the precision of
positive j is ``j / (j + K_j)``. With this convention, the realized counts of a
complete gallery (x_j = K_j/N) reproduce that gallery's exact AP@k.

Two ways to turn hardness into a prediction:
- ``plugin`` (the paper's map): the expected rank ``r_j = j + N·x_j`` plugged
  into ``prec = j / r_j``, summed where ``r_j ≤ k``. It targets the realized
  metric of one large gallery.
- ``binomial`` / ``poisson``: the exact expectation E[AP@k] under the rank law.
  AP@k is a sum of per-positive terms f_j(K_j), so by linearity only the
  marginal law of each K_j matters; the coupling of the nested counts
  K_1 ≤ K_2 ≤ ... (multinomial increments between consecutive positives)
  changes the spread of AP@k, never its mean. The difference to ``plugin`` is
  the Jensen bias of plugging in expected ranks.
"""

from __future__ import annotations

import math

import torch

RANK_LAWS = ("plugin", "binomial", "poisson")


def sort_positives(pos_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort each row's positives (descending, NaN padding last) and tie-aware indices.

    Args:
        pos_scores: (Q, m) positive scores, NaN where a query has fewer positives.

    Returns:
        sorted_scores: (Q, m) float64, descending, NaN padding at the end.
        valid: (Q, m) bool, True for real positives.
        j: (Q, m) float64, number of real positives of the row scoring ≥ this one
            (pessimistic ties), 0 at padding.
    """
    s = pos_scores.to(torch.float64)
    valid_in = ~torch.isnan(s)
    keyed = torch.where(valid_in, s, torch.full_like(s, -torch.inf))
    order = torch.argsort(keyed, dim=1, descending=True, stable=True)
    sorted_scores = s.gather(1, order)
    valid = valid_in.gather(1, order)
    ascending = torch.where(valid, sorted_scores, torch.full_like(s, -torch.inf)).flip(1)
    probe = torch.where(valid, sorted_scores, torch.zeros_like(s)).contiguous()
    below = torch.searchsorted(ascending.contiguous(), probe, side="left")
    j = (s.shape[1] - below).to(torch.float64)
    return sorted_scores, valid, torch.where(valid, j, torch.zeros_like(j))


def ap_from_precision_terms(terms: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """Per-query AP@k = Σ_j (precision term of positive j) / min(k, m); NaN when m = 0.

    Args:
        terms: (Q, m) per-positive (expected) precision terms, 0 at padding.
        valid: (Q, m) bool mask of real positives.
        k: cut-off.
    """
    norm = valid.sum(1).to(torch.float64).clamp(max=float(k))
    out = terms.sum(1) / norm.clamp_min(1.0)
    return torch.where(norm > 0, out, torch.full_like(out, torch.nan))


def ap_at_k_from_counts(
    j: torch.Tensor, valid: torch.Tensor, counts: torch.Tensor, k: int
) -> torch.Tensor:
    """Per-query AP@k from (expected) distractor counts above each positive.

    Args:
        j: (Q, m) tie-aware positive index from :func:`sort_positives`.
        valid: (Q, m) bool mask of real positives.
        counts: (Q, m) distractors scoring ≥ each positive (N·x_j; may be
            fractional for a prediction).
        k: cut-off (AP@k).

    Returns:
        (Q,) float64 AP@k; NaN for rows with no positive.
    """
    rank = j + counts.to(torch.float64)
    # Relative slack so that N·(K/N) rounding to K + 1 ulp still counts as rank K.
    inside = valid & (rank <= k * (1.0 + 1e-12))
    prec = torch.where(inside, j / rank.clamp_min(1.0), torch.zeros_like(rank))
    return ap_from_precision_terms(prec, valid, k)


def expected_precision_terms(
    j: torch.Tensor,
    valid: torch.Tensor,
    hardness: torch.Tensor,
    gallery_size: int,
    k: int,
    law: str = "binomial",
    max_elements: int = 1 << 24,
) -> torch.Tensor:
    """Per-positive ``E[j/(j + K_j) · 1{j + K_j ≤ k}]`` when K_j ~ Binomial(N, x_j) (or Poisson(N·x_j)).

    Exact (no sampling), evaluated in query chunks of at most ``max_elements`` terms.

    Args:
        j, valid: from :func:`sort_positives`, (Q, m).
        hardness: (Q, m) population fractions x_j ∈ [0, 1] (ignored where not valid).
        gallery_size: N.
        k: cut-off.
        law: "binomial" or "poisson".

    Returns:
        (Q, m) float64, 0 where not valid.
    """
    if law not in ("binomial", "poisson"):
        raise ValueError(f"law must be 'binomial' or 'poisson', got {law!r}")
    x = torch.where(
        valid, hardness.to(torch.float64), torch.zeros_like(hardness, dtype=torch.float64)
    )
    x = x.clamp(0.0, 1.0)
    n = float(gallery_size)
    Q, m = x.shape
    kk = torch.arange(k, dtype=torch.float64)  # K = 0 .. k−1
    out = torch.zeros(Q, m, dtype=torch.float64)
    rows = max(1, max_elements // max(1, m * k))
    log_fact_k = torch.lgamma(kk + 1.0)
    for start in range(0, Q, rows):
        xs = x[start : start + rows].unsqueeze(-1)
        js = j[start : start + rows].unsqueeze(-1)
        vs = valid[start : start + rows].unsqueeze(-1)
        if law == "binomial":
            log_pmf = (
                torch.lgamma(torch.tensor(n + 1.0, dtype=torch.float64))
                - log_fact_k
                - torch.lgamma((n - kk).clamp_min(0.0) + 1.0)
                + torch.xlogy(kk, xs)
                + torch.xlogy((n - kk).clamp_min(0.0), 1.0 - xs)
            )
            log_pmf = torch.where(kk <= n, log_pmf, torch.full_like(log_pmf, -torch.inf))
        else:
            lam = n * xs
            log_pmf = torch.xlogy(kk, lam) - lam - log_fact_k
        term = js / (js + kk) * torch.exp(log_pmf)
        term = torch.where(vs & (js + kk <= k), term, torch.zeros_like(term))
        out[start : start + rows] = term.sum(-1)
    return out


def ap_at_k_from_hardness(
    j: torch.Tensor,
    valid: torch.Tensor,
    hardness: torch.Tensor,
    gallery_size: int,
    k: int,
    rank_law: str = "plugin",
) -> torch.Tensor:
    """Per-query predicted AP@k at gallery size N from hardness x (Q, m).

    ``rank_law``: "plugin" (expected ranks r_j = j + N·x_j, the paper's map),
    "binomial" or "poisson" (exact E[AP@k] under that rank law:
    ``(1/min(k, m)) Σ_j Σ_{K=0}^{k−j} j/(j+K) · P(K_j = K)``, the sum of
    :func:`expected_precision_terms`).
    """
    if rank_law == "plugin":
        return ap_at_k_from_counts(j, valid, float(gallery_size) * hardness.to(torch.float64), k)
    if rank_law in ("binomial", "poisson"):
        terms = expected_precision_terms(j, valid, hardness, gallery_size, k, law=rank_law)
        return ap_from_precision_terms(terms, valid, k)
    raise ValueError(f"unknown rank_law {rank_law!r}; known: {', '.join(RANK_LAWS)}")


def expected_precision(
    j: torch.Tensor,
    base: torch.Tensor,
    r: torch.Tensor,
    mean: torch.Tensor,
    mix: torch.Tensor,
    k: int,
    max_elements: int = 1 << 23,
) -> torch.Tensor:
    """E[ j/(j + base + K') · 1{j + base + K' ≤ k} ] with K' a mixture of negative binomials.

    Args:
        j: (P,) tie-aware positive index.
        base: (P,) known count (sampled distractors ≥ the positive).
        r: (P,) negative-binomial size (> 0), shared by the components.
        mean: (P, G) negative-binomial mean (≥ 0; 0 = no further distractor).
        mix: (P, G) mixture weights (rows sum to 1).
        k: AP cut-off.

    Returns:
        (P,) float64.
    """
    # Components no positive gives weight to cost time and add nothing.
    keep = (mix > 1e-10).any(0)
    mean, mix = mean[:, keep], mix[:, keep]
    mix = mix / mix.sum(1, keepdim=True).clamp_min(1e-300)
    P, G = mean.shape
    out = torch.zeros(P, dtype=torch.float64)
    room = (k - j - base).to(torch.float64)  # largest K' still inside the top k
    live = room >= 0
    if not bool(live.any()) or P == 0:
        return out
    width = int(room[live].max()) + 1
    kk = torch.arange(width, dtype=torch.float64)
    lg_k1 = torch.lgamma(kk + 1.0)
    rows = max(1, max_elements // max(1, G * width))
    idx_live = live.nonzero().squeeze(1)
    for start in range(0, idx_live.numel(), rows):
        sel = idx_live[start : start + rows]
        rr = r[sel].to(torch.float64)  # (p,): one size per positive
        mu = mean[sel].to(torch.float64)  # (p, G)
        # log NB(K; r, μ) = [lgamma(K + r) − lgamma(r) − lgamma(K + 1)] + r·log(r/(r+μ)) + K·log(μ/(r+μ));
        # the bracket depends on (positive, K) only, not on the mixture component.
        head = (
            torch.lgamma(kk + rr.unsqueeze(1)) - torch.lgamma(rr).unsqueeze(1) - lg_k1
        )  # (p, width)
        r_log = rr.unsqueeze(1) * (torch.log(rr).unsqueeze(1) - torch.log(rr.unsqueeze(1) + mu))
        log_q = torch.log(mu / (rr.unsqueeze(1) + mu))  # (p, G), -inf where μ = 0
        slope = torch.where(mu > 0, log_q, torch.zeros_like(log_q)).unsqueeze(-1)
        log_p = head.unsqueeze(1) + r_log.unsqueeze(-1) + kk * slope
        # μ = 0: all mass at K' = 0. In place: the (p, G, width) block is the loop's cost.
        log_p[..., 1:].masked_fill_(~(mu > 0).unsqueeze(-1), -math.inf)
        pmf = log_p.exp_()  # (p, G, width)
        jj = j[sel].to(torch.float64).view(-1, 1)
        bb = base[sel].to(torch.float64).view(-1, 1)
        prec = jj / (jj + bb + kk)  # (p, width)
        prec = torch.where(kk <= room[sel].view(-1, 1), prec, torch.zeros_like(prec))
        per_comp = pmf.mul_(prec.unsqueeze(1)).sum(-1)  # (p, G)
        out[sel] = (per_comp * mix[sel].to(torch.float64)).sum(-1)
    return out
