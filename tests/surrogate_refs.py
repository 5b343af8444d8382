"""Float64 references for the SoftBin, BlackBox and SupAP losses (``rl_gap/losses/``).

Independent of rl_gap's kernels, written from the definitions:
- ``brute_*``: the surrogate of one explicit list, float64, Python loops / full
  broadcasts (autograd of the reference gives gradients);
- ``fastap_transcription``: FastAP's formula as published (Cakir et al., CVPR
  2019), on squared Euclidean distances of unit embeddings;
- ``exact_ap``: AP with ties counted pessimistically, pair by pair;
- ``blackbox_reference``: the BlackBox loss and its gradient from the defining
  formula ``−(r̃(s) − r̃(s + λ·∂L/∂r̃)) / λ`` with loop-counted ranks.
Negative dropping: per list, drop the floor(α·N) lowest negatives, ties by
position (the rule of ``rl_gap/losses/common.py``).
"""

from __future__ import annotations

import math

import torch


def make_batch(seed: int, q: int = 7, d: int = 9, on_grid: int | None = None):
    """float64 sims in (−1, 1), ≥ 1 positive in most rows, 2 rows without, random valid mask."""
    gen = torch.Generator().manual_seed(seed)
    if on_grid:  # every score on one of `on_grid` bin centres of [−1, 1] (many ties)
        sim = torch.randint(0, on_grid, (q, d), generator=gen).double() * (2 / (on_grid - 1)) - 1
    else:
        sim = (torch.rand(q, d, generator=gen, dtype=torch.float64) * 1.8 - 0.9).round(decimals=6)
    rel = torch.rand(q, d, generator=gen) < 0.35
    rel[0, :2] = True
    rel[-2:] = False  # distractor rows: no positive
    valid = torch.rand(q, d, generator=gen) > 0.15
    valid[0, :2] = True
    return sim, rel, valid


def lists(sim, rel, valid, per_query: bool, alpha: float = 0.0):
    """The ranked lists a loss sees: [(scores tensor, [is_pos])], after negative dropping."""
    if per_query:
        rows = [[(q, d) for d in range(sim.shape[1]) if valid[q, d]] for q in range(sim.shape[0])]
    else:
        rows = [[(q, d) for q in range(sim.shape[0]) for d in range(sim.shape[1]) if valid[q, d]]]
    out = []
    for items in rows:
        pos = [bool(rel[i]) for i in items]
        if not any(pos):
            continue
        negs = [k for k, p in enumerate(pos) if not p]
        n_drop = math.floor(alpha * len(negs) + 1e-9)
        dropped = set(sorted(negs, key=lambda k: (float(sim[items[k]].detach()), k))[:n_drop])
        keep = [k for k in range(len(items)) if k not in dropped]
        out.append((torch.stack([sim[items[k]] for k in keep]), [pos[k] for k in keep]))
    return out


def mean_list_loss(sim, rel, valid, per_query, list_ap, alpha=0.0, symmetric=False):
    ap = torch.stack([list_ap(s, p) for s, p in lists(sim, rel, valid, per_query, alpha)]).mean()
    if symmetric:
        ap_t = torch.stack([list_ap(s, p) for s, p in lists(sim.T, rel.T, valid.T, True, alpha)])
        ap = 0.5 * (ap + ap_t.mean())
    return 1.0 - ap


def exact_ap(scores: list[float], pos: list[bool]) -> float:
    """AP, ties pessimistic: precision at i counts every item scoring ≥ s_i."""
    precisions = []
    for i, p in enumerate(pos):
        if p:
            above = [j for j in range(len(scores)) if scores[j] >= scores[i]]
            precisions.append(sum(pos[j] for j in above) / len(above))
    return sum(precisions) / len(precisions)


def flat_one_row(sim, rel, valid):
    return sim[valid][None], rel[valid][None], torch.ones(1, int(valid.sum()), dtype=torch.bool)


def value_and_grad(loss_fn, sim, rel, valid, scale: float = 1.0):
    leaf = sim.clone().requires_grad_(True)
    loss = loss_fn(leaf, rel, valid)
    (scale * loss).backward()
    return loss.detach(), leaf.grad


def brute_softbin_ap(scores: torch.Tensor, pos: list[bool], num_bins: int, lo=-1.0, hi=1.0):
    """FastAP on similarities: explicit (M × (L+1)) triangular-kernel matrix, a loop over bins.

    ``num_bins`` = L intervals of [lo, hi], L + 1 centres (FastAP's convention).
    """
    width = (hi - lo) / num_bins
    centres = torch.tensor([hi - b * width for b in range(num_bins + 1)], dtype=torch.float64)
    kernel = (1 - (scores.clamp(lo, hi)[:, None] - centres[None]).abs() / width).clamp(min=0)
    pos_t = torch.tensor(pos, dtype=torch.float64)
    h_all, h_pos = kernel.sum(0), (kernel * pos_t[:, None]).sum(0)
    total, cum_all, cum_pos = 0.0, 0.0, 0.0
    for b in range(num_bins + 1):
        cum_all = cum_all + h_all[b]
        cum_pos = cum_pos + h_pos[b]
        if float(cum_all.detach()) > 0:
            total = total + h_pos[b] * cum_pos / cum_all
    return total / sum(pos)


def fastap_transcription(query: torch.Tensor, items: torch.Tensor, pos: list[bool], L: int):
    """FastAP (Cakir et al. 2019, eq. for the histogram approximation), transcribed from the
    released code (``Delta = 4/num_bins``, ``Z = linspace(0, 4, num_bins + 1)``):
    distances D = ||q − x||² ∈ [0, 4] of unit vectors, L = num_bins intervals, bin centres
    z_j = j·Δ for j = 0 … L, Δ = 4/L, δ(D, z_j) = max(0, 1 − |D − z_j|/Δ), h_j⁺ / h_j the
    soft counts of positives / all items, H the cumulative sums,
    FastAP = (1/N⁺) Σ_j h_j⁺ H_j⁺ / H_j."""
    dist = ((items - query) ** 2).sum(1)
    delta = 4.0 / L
    fast_ap = 0.0
    big_h, big_h_pos = 0.0, 0.0
    for j in range(L + 1):
        z = j * delta
        soft = (1 - (dist - z).abs() / delta).clamp(min=0)
        h = float(soft.sum())
        h_pos = float(sum(float(soft[i]) for i in range(len(pos)) if pos[i]))
        big_h += h
        big_h_pos += h_pos
        if big_h > 0:
            fast_ap += h_pos * big_h_pos / big_h
    return fast_ap / sum(pos)


def loop_ranks(scores: list[float], members: list[bool]) -> list[int]:
    """rk_i = |{j member : s_j ≥ s_i}| for members, 0 otherwise."""
    return [
        sum(1 for j, m in enumerate(members) if m and scores[j] >= scores[i]) if members[i] else 0
        for i in range(len(scores))
    ]


def blackbox_reference(sim, rel, valid, per_query, lam, margin, alpha=0.0, scale=1.0):
    """Loss value and the blackbox gradient, from the defining formula with loop ranks.

    L = scale · (1 − mean_lists (1/|P|) Σ_{i∈P} rk⁺_i / (r̃_i · n)), r̃ = rk/n.
    Upstream g_i = ∂L/∂r̃_i = scale · (1/#lists)(1/|P|) rk⁺_i / (r̃_i² n) on positives;
    s' = s_shift + λ g; ∂L/∂s_i = −(r̃_i(s_shift) − r̃_i(s')) / λ, scattered to sim.
    """
    grad = torch.zeros_like(sim)
    if per_query:
        index_lists = [
            [(q, d) for d in range(sim.shape[1]) if valid[q, d]] for q in range(sim.shape[0])
        ]
    else:
        index_lists = [
            [(q, d) for q in range(sim.shape[0]) for d in range(sim.shape[1]) if valid[q, d]]
        ]
    kept = []
    for items in index_lists:
        pos = [bool(rel[i]) for i in items]
        if not any(pos):
            continue
        negs = [k for k, p in enumerate(pos) if not p]
        n_drop = math.floor(alpha * len(negs) + 1e-9)
        dropped = set(sorted(negs, key=lambda k: (float(sim[items[k]]), k))[:n_drop])
        kept.append([(items[k], pos[k]) for k in range(len(items)) if k not in dropped])
    num_lists = len(kept)
    aps = []
    for entries in kept:
        idx = [e[0] for e in entries]
        pos = [e[1] for e in entries]
        n = len(idx)
        shifted = [float(sim[i]) - (margin if p else 0.0) for i, p in zip(idx, pos)]
        rk = loop_ranks(shifted, [True] * n)
        rk_pos = loop_ranks(shifted, pos)
        num_pos = sum(pos)
        aps.append(sum(rk_pos[i] / rk[i] for i in range(n) if pos[i]) / num_pos)
        r_tilde = [r / n for r in rk]
        g = [
            scale * rk_pos[i] / (r_tilde[i] ** 2 * n) / (num_lists * num_pos) if pos[i] else 0.0
            for i in range(n)
        ]
        perturbed = [shifted[i] + lam * g[i] for i in range(n)]
        r_prime = [r / n for r in loop_ranks(perturbed, [True] * n)]
        for i in range(n):
            grad[idx[i]] += -(r_tilde[i] - r_prime[i]) / lam
    return 1.0 - sum(aps) / num_lists, grad


def brute_supap(scores: torch.Tensor, pos: list[bool], tau, rho, offset, margin, start=0.5):
    """Ramzi et al.'s SupAP as written in the paper's rank form, full broadcast (``start``:
    H⁻'s step at t = 0 inside the band, 1/2 in the paper, 0 in the released iNaturalist config):
    rank(k) = 1 + Σ_{j≠k, j∈P} H(s_j − s_k) + Σ_{j∈N} H⁻(s_j − s_k),
    rank⁺(k) = 1 + Σ_{j≠k, j∈P} H(s_j − s_k), H(0) = 1; AP = mean_{k∈P} rank⁺/rank."""
    pos_t = torch.tensor(pos)
    diff = scores[None, :] - scores[:, None]  # [k, j] = s_j − s_k
    step = (diff >= 0).double()
    smooth = torch.where(
        diff <= 0,
        torch.sigmoid(diff / tau),
        torch.where(diff <= margin, start + torch.sigmoid(diff / tau), rho * diff + offset),
    )
    not_self = ~torch.eye(len(pos), dtype=torch.bool)
    rank_pos = 1 + (step * (pos_t[None] & not_self)).sum(1)
    rank = rank_pos + (smooth * ~pos_t[None]).sum(1)
    return (rank_pos / rank)[pos_t].mean()
