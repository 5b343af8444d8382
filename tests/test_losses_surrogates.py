"""SoftBin, BlackBox and SupAP (per-query and global) against float64 references written here.

References, all independent of rl_gap's kernels:
- ``brute_*``: the surrogate's definition over explicit lists, float64, with
  Python loops / full broadcasts (autograd of the reference for gradients);
- ``fastap_transcription``: FastAP's formula as published (Cakir et al., CVPR
  2019), on squared Euclidean distances of unit embeddings;
- ``exact_ap``: AP with ties counted pessimistically, counted pair by pair;
- BlackBox's gradient is checked against its defining finite-difference
  formula ``−(r̃(s) − r̃(s + λ·∂L/∂r̃)) / λ`` evaluated with the loop ranks.
Negative dropping in the references: per list, drop the floor(α·N) lowest
negatives, ties by position (the rule of ``rl_gap/losses/common.py``).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rl_gap.losses import build_loss, loss_from_config

PER_QUERY = ["softbin", "blackbox", "supap"]
GLOBAL = ["gsoftbin", "gblackbox", "gsupap"]
ALL = PER_QUERY + GLOBAL


# ----------------------------------------------------------------------------- data


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


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any aten op produces (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def metric_batch(batch: int = 64, seed: int = 9):
    gen = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(batch, 8, generator=gen), dim=1)
    labels = torch.arange(batch) // 4
    return emb, labels.unsqueeze(1) == labels.unsqueeze(0), ~torch.eye(batch, dtype=torch.bool)


def value_and_grad(loss_fn, sim, rel, valid, scale: float = 1.0):
    leaf = sim.clone().requires_grad_(True)
    loss = loss_fn(leaf, rel, valid)
    (scale * loss).backward()
    return loss.detach(), leaf.grad


# ----------------------------------------------------------------------------- SoftBin


def brute_softbin_ap(scores: torch.Tensor, pos: list[bool], num_bins: int, lo=-1.0, hi=1.0):
    """FastAP on similarities: explicit (M × L) triangular-kernel matrix, a loop over bins."""
    width = (hi - lo) / (num_bins - 1)
    centres = torch.tensor([hi - b * width for b in range(num_bins)], dtype=torch.float64)
    kernel = (1 - (scores.clamp(lo, hi)[:, None] - centres[None]).abs() / width).clamp(min=0)
    pos_t = torch.tensor(pos, dtype=torch.float64)
    h_all, h_pos = kernel.sum(0), (kernel * pos_t[:, None]).sum(0)
    total, cum_all, cum_pos = 0.0, 0.0, 0.0
    for b in range(num_bins):
        cum_all = cum_all + h_all[b]
        cum_pos = cum_pos + h_pos[b]
        if float(cum_all.detach()) > 0:
            total = total + h_pos[b] * cum_pos / cum_all
    return total / sum(pos)


def fastap_transcription(query: torch.Tensor, items: torch.Tensor, pos: list[bool], L: int):
    """FastAP (Cakir et al. 2019, eq. for the histogram approximation), transcribed:
    distances D = ||q − x||² ∈ [0, 4] of unit vectors, bin centres z_j = (j−1)·Δ,
    Δ = 4/(L−1), δ(D, z_j) = max(0, 1 − |D − z_j|/Δ), h_j⁺ / h_j the soft counts of
    positives / all items, H the cumulative sums, FastAP = (1/N⁺) Σ_j h_j⁺ H_j⁺ / H_j."""
    dist = ((items - query) ** 2).sum(1)
    delta = 4.0 / (L - 1)
    fast_ap = 0.0
    big_h, big_h_pos = 0.0, 0.0
    for j in range(L):
        z = j * delta
        soft = (1 - (dist - z).abs() / delta).clamp(min=0)
        h = float(soft.sum())
        h_pos = float(sum(float(soft[i]) for i in range(len(pos)) if pos[i]))
        big_h += h
        big_h_pos += h_pos
        if big_h > 0:
            fast_ap += h_pos * big_h_pos / big_h
    return fast_ap / sum(pos)


@pytest.mark.parametrize("per_query", [True, False])
@pytest.mark.parametrize("num_bins", [5, 10, 41])
@pytest.mark.parametrize("alpha", [0.0, 0.4])
def test_softbin_matches_brute_force_value_and_gradient(per_query, num_bins, alpha):
    sim, rel, valid = make_batch(seed=num_bins)
    name = "softbin" if per_query else "gsoftbin"
    loss_fn = build_loss(name, num_bins=num_bins, neg_drop=alpha)
    value, grad = value_and_grad(loss_fn, sim, rel, valid, scale=2.5)
    ref_leaf = sim.clone().requires_grad_(True)
    ref = mean_list_loss(
        ref_leaf, rel, valid, per_query, lambda s, p: brute_softbin_ap(s, p, num_bins), alpha
    )
    (2.5 * ref).backward()
    torch.testing.assert_close(value, ref.detach(), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(grad, ref_leaf.grad, rtol=1e-9, atol=1e-11)
    assert grad.abs().sum() > 0


def test_softbin_symmetric_matches_brute_force():
    sim, rel, valid = make_batch(seed=3, q=8, d=8)
    value, _ = value_and_grad(build_loss("softbin", num_bins=7, symmetric=True), sim, rel, valid)
    ref = mean_list_loss(sim, rel, valid, True, lambda s, p: brute_softbin_ap(s, p, 7), 0, True)
    torch.testing.assert_close(value, ref, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("num_bins", [10, 25])
def test_softbin_equals_published_fastap_on_unit_embeddings(num_bins):
    gen = torch.Generator().manual_seed(num_bins)
    emb = torch.randn(12, 5, generator=gen, dtype=torch.float64)
    emb = torch.nn.functional.normalize(emb, dim=1)
    labels = torch.arange(12) % 3
    sim, rel = emb @ emb.T, labels[:, None] == labels[None]
    valid = ~torch.eye(12, dtype=torch.bool)
    expected = []
    for q in range(12):
        cols = [d for d in range(12) if d != q]
        pos = [bool(rel[q, d]) for d in cols]
        expected.append(fastap_transcription(emb[q], emb[cols], pos, num_bins))
    loss = build_loss("softbin", num_bins=num_bins)(sim, rel, valid)
    assert float(loss) == pytest.approx(1 - sum(expected) / len(expected), abs=1e-12)


@pytest.mark.parametrize("per_query", [True, False])
def test_softbin_on_bin_centres_is_exact_ap_with_pessimistic_ties(per_query):
    sim, rel, valid = make_batch(seed=5, on_grid=9)
    loss = build_loss("softbin" if per_query else "gsoftbin", num_bins=9)(sim, rel, valid)
    aps = [exact_ap(s.tolist(), p) for s, p in lists(sim, rel, valid, per_query)]
    assert float(loss) == pytest.approx(1 - sum(aps) / len(aps), abs=1e-12)


def test_softbin_gradcheck_float64():
    sim, rel, valid = make_batch(seed=11, q=5, d=6)
    for name in ("softbin", "gsoftbin"):
        loss_fn = build_loss(name, num_bins=6)
        leaf = sim.clone().requires_grad_(True)
        assert torch.autograd.gradcheck(lambda s, f=loss_fn: f(s, rel, valid), (leaf,), eps=1e-7)


def test_softbin_range_is_checked_with_rounding_tolerance():
    sim, rel, valid = make_batch(seed=1)
    with pytest.raises(ValueError, match=r"sim_range \[-1.0, 1.0\].*normalise"):
        build_loss("gsoftbin")(sim * 3, rel, valid)
    nudged = sim.clone()
    nudged[0, 0] = 1.004  # a bf16 cosine of ~1: clamped into the top bin, no error
    clamped = nudged.clone()
    clamped[0, 0] = 1.0
    for name in ("softbin", "gsoftbin"):
        torch.testing.assert_close(
            build_loss(name)(nudged, rel, valid), build_loss(name)(clamped, rel, valid)
        )
    invalid_only = sim.clone()
    invalid_only[~valid] = 50.0  # ignored pairs are not range-checked
    build_loss("softbin")(invalid_only, rel, valid)
    wide = build_loss("softbin", sim_range=(-3, 3))
    assert torch.isfinite(wide(sim * 3, rel, valid))


# ----------------------------------------------------------------------------- BlackBox


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


@pytest.mark.parametrize("per_query", [True, False])
@pytest.mark.parametrize("lam", [0.5, 4.0, 40.0])
@pytest.mark.parametrize("margin", [0.0, 0.05])
def test_blackbox_value_and_defining_gradient(per_query, lam, margin):
    sim, rel, valid = make_batch(seed=int(lam * 10) + int(margin * 100), q=8, d=10)
    name = "blackbox" if per_query else "gblackbox"
    loss_fn = build_loss(name, lambda_val=lam, margin=margin)
    value, grad = value_and_grad(loss_fn, sim, rel, valid, scale=3.0)
    ref_value, ref_grad = blackbox_reference(sim, rel, valid, per_query, lam, margin, scale=3.0)
    assert float(value) == pytest.approx(ref_value, abs=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    assert (grad != 0).sum() >= 4  # λ large enough to move ranks: a real check


@pytest.mark.parametrize("per_query", [True, False])
def test_blackbox_forward_is_exact_ap_with_ties(per_query):
    sim, rel, valid = make_batch(seed=21, on_grid=5)  # many ties
    loss = build_loss("blackbox" if per_query else "gblackbox", margin=0.0)(sim, rel, valid)
    aps = [exact_ap(s.tolist(), p) for s, p in lists(sim, rel, valid, per_query)]
    assert float(loss) == pytest.approx(1 - sum(aps) / len(aps), abs=1e-12)


def test_blackbox_neg_drop_and_symmetric():
    sim, rel, valid = make_batch(seed=4, q=8, d=8)
    for per_query in (True, False):
        name = "blackbox" if per_query else "gblackbox"
        value, grad = value_and_grad(build_loss(name, neg_drop=0.3), sim, rel, valid)
        ref_value, ref_grad = blackbox_reference(sim, rel, valid, per_query, 4.0, 0.02, alpha=0.3)
        assert float(value) == pytest.approx(ref_value, abs=1e-12)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    sym = build_loss("blackbox", margin=0.0, symmetric=True)(sim, rel, valid)
    ref = mean_list_loss(
        sim,
        rel,
        valid,
        True,
        lambda s, p: torch.tensor(exact_ap(s.tolist(), p), dtype=torch.float64),
        0,
        True,
    )
    assert float(sym) == pytest.approx(float(ref), abs=1e-12)


# ----------------------------------------------------------------------------- SupAP


def brute_supap(scores: torch.Tensor, pos: list[bool], tau, rho, offset, margin):
    """Ramzi et al.'s SupAP as written in the paper's rank form, full broadcast:
    rank(k) = 1 + Σ_{j≠k, j∈P} H(s_j − s_k) + Σ_{j∈N} H⁻(s_j − s_k),
    rank⁺(k) = 1 + Σ_{j≠k, j∈P} H(s_j − s_k), H(0) = 1; AP = mean_{k∈P} rank⁺/rank."""
    pos_t = torch.tensor(pos)
    diff = scores[None, :] - scores[:, None]  # [k, j] = s_j − s_k
    step = (diff >= 0).double()
    smooth = torch.where(
        diff <= 0,
        torch.sigmoid(diff / tau),
        torch.where(diff <= margin, 0.5 + torch.sigmoid(diff / tau), rho * diff + offset),
    )
    not_self = ~torch.eye(len(pos), dtype=torch.bool)
    rank_pos = 1 + (step * (pos_t[None] & not_self)).sum(1)
    rank = rank_pos + (smooth * ~pos_t[None]).sum(1)
    return (rank_pos / rank)[pos_t].mean()


SUPAP_SETTINGS = [
    dict(temperature=0.01, rho=100.0, offset=1.44, margin=0.05),  # released defaults
    dict(temperature=0.1, rho=10.0, offset=1.0, margin=0.0),  # two-piece form
    dict(temperature=0.05, rho=3.0, offset=2.0, margin=0.2),
]


@pytest.mark.parametrize("per_query", [True, False])
@pytest.mark.parametrize("setting", range(len(SUPAP_SETTINGS)))
@pytest.mark.parametrize("alpha", [0.0, 0.5])
def test_supap_matches_brute_force_value_and_gradient(per_query, setting, alpha):
    kw = SUPAP_SETTINGS[setting]
    sim, rel, valid = make_batch(seed=30 + setting, q=8, d=10)
    name = "supap" if per_query else "gsupap"
    value, grad = value_and_grad(build_loss(name, neg_drop=alpha, **kw), sim, rel, valid, 1.7)
    ref_leaf = sim.clone().requires_grad_(True)
    args = (kw["temperature"], kw["rho"], kw["offset"], kw["margin"])
    ref = mean_list_loss(
        ref_leaf, rel, valid, per_query, lambda s, p: brute_supap(s, p, *args), alpha
    )
    (1.7 * ref).backward()
    torch.testing.assert_close(value, ref.detach(), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(grad, ref_leaf.grad, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("chunk_size", [1, 3, 1000])
def test_supap_chunking_and_symmetric(chunk_size):
    sim, rel, valid = make_batch(seed=8, q=9, d=9)
    for name in ("supap", "gsupap"):
        kwargs = dict(chunk_size=chunk_size, temperature=0.05)
        if name == "supap":
            kwargs["symmetric"] = True
        value, grad = value_and_grad(build_loss(name, **kwargs), sim, rel, valid)
        ref_leaf = sim.clone().requires_grad_(True)
        ref = mean_list_loss(
            ref_leaf,
            rel,
            valid,
            name == "supap",
            lambda s, p: brute_supap(s, p, 0.05, 100.0, 1.44, 0.05),
            symmetric=name == "supap",
        )
        ref.backward()
        torch.testing.assert_close(value, ref.detach(), rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(grad, ref_leaf.grad, rtol=1e-9, atol=1e-11)


def test_supap_gradcheck_and_upper_bound():
    sim, rel, valid = make_batch(seed=13, q=5, d=6)
    for name in ("supap", "gsupap"):
        loss_fn = build_loss(name, temperature=0.2, rho=5.0, margin=0.1)
        leaf = sim.clone().requires_grad_(True)
        assert torch.autograd.gradcheck(lambda s, f=loss_fn: f(s, rel, valid), (leaf,), eps=1e-7)
    # offset ≥ 1 makes H⁻ ≥ step (no ties here): 1 − SupAP ≥ 1 − AP, list by list.
    for per_query, name in ((True, "supap"), (False, "gsupap")):
        aps = [exact_ap(s.tolist(), p) for s, p in lists(sim, rel, valid, per_query)]
        assert float(build_loss(name)(sim, rel, valid)) >= 1 - sum(aps) / len(aps)


# ----------------------------------------------------------------------------- all six


@pytest.mark.parametrize("name", PER_QUERY)
def test_global_equals_per_query_on_the_flattened_one_row_matrix(name):
    sim, rel, valid = make_batch(seed=17, q=8, d=9)
    value, grad = value_and_grad(build_loss("g" + name, neg_drop=0.25), sim, rel, valid)
    flat, flat_rel, flat_valid = flat_one_row(sim, rel, valid)
    one_value, one_grad = value_and_grad(
        build_loss(name, neg_drop=0.25), flat, flat_rel, flat_valid
    )
    torch.testing.assert_close(value, one_value, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad[valid], one_grad[0], rtol=1e-12, atol=1e-14)
    assert (grad[~valid] == 0).all()
    # and it differs from the per-query mean: the lists are not the same
    assert abs(float(value) - float(build_loss(name)(sim, rel, valid))) > 1e-3


@pytest.mark.parametrize("name", ALL)
def test_bad_inputs_and_no_positive_batch(name):
    sim, rel, valid = make_batch(seed=2)
    loss_fn = build_loss(name)
    with pytest.raises(ValueError, match="2-D"):
        loss_fn(sim[0], rel[0], valid[0])
    with pytest.raises(ValueError, match="rel shape"):
        loss_fn(sim, rel[:, :3], valid)
    with pytest.raises(ValueError, match="bool"):
        loss_fn(sim, rel.float(), valid)
    bad = sim.clone()
    bad[1, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        loss_fn(bad, rel, valid)
    leaf = sim.clone().requires_grad_(True)
    with pytest.warns(UserWarning, match="no valid positive"):
        loss = loss_fn(leaf, torch.zeros_like(rel), valid)
    loss.backward()
    assert float(loss.detach()) == 0.0 and (leaf.grad == 0).all()


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("softbin", {"num_bins": 1}, "num_bins"),
        ("gsoftbin", {"num_bins": 2.5}, "num_bins"),
        ("softbin", {"sim_range": (1.0, -1.0)}, "lo < hi"),
        ("gsoftbin", {"sim_range": "x"}, "sim_range"),
        ("blackbox", {"lambda_val": 0.0}, "lambda_val"),
        ("gblackbox", {"margin": -0.1}, "margin"),
        ("supap", {"temperature": 0.0}, "temperature"),
        ("gsupap", {"rho": -1.0}, "rho"),
        ("supap", {"offset": float("inf")}, "offset"),
        ("gsupap", {"chunk_size": 0}, "chunk_size"),
        ("softbin", {"neg_drop": 1.0}, "neg_drop"),
    ],
)
def test_bad_hyper_parameters(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_loss(name, **kwargs)


@pytest.mark.parametrize("name", ALL)
def test_bf16_autocast_ranks_in_float32(name):
    emb, rel, valid = metric_batch(batch=24)
    emb = emb.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sim = emb @ emb.T  # bf16 under autocast
        loss = build_loss(name)(sim, rel, valid)
    loss.backward()
    assert sim.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert torch.isfinite(emb.grad).all()
    # the same bf16 similarities ranked in float64 outside autocast
    reference = build_loss(name)(sim.detach().double(), rel, valid)
    assert float(loss.detach()) == pytest.approx(float(reference), abs=1e-5)


@pytest.mark.parametrize("name", ALL)
def test_float32_gradient_unchanged_by_autocast(name):
    """Autocast must not push the losses' internal products (e.g. SupAP's) to bf16."""
    emb, rel, valid = metric_batch(batch=24, seed=3)
    sim = (emb @ emb.T).float()
    plain = value_and_grad(build_loss(name), sim, rel, valid)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = value_and_grad(build_loss(name), sim, rel, valid)
    torch.testing.assert_close(mixed[0], plain[0], rtol=0, atol=0)
    torch.testing.assert_close(mixed[1], plain[1], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", GLOBAL)
def test_global_losses_never_materialise_pairs_by_pairs(name):
    emb, rel, valid = metric_batch(batch=48)
    sim = emb @ emb.T
    num_items, num_pos = int(valid.sum()), int((rel & valid).sum())  # M = 2256, P = 144
    kwargs = {"chunk_size": 4} if name == "gsupap" else {}
    leaf = sim.clone().requires_grad_(True)
    with LargestTensor() as mode:
        build_loss(name, **kwargs)(leaf, rel, valid).backward()
    bound = 4 * num_items if name == "gsupap" else sim.numel()
    assert mode.numel <= bound < num_pos * num_items // 30


def test_supap_per_query_chunks_rows():
    emb, rel, valid = metric_batch(batch=48)
    leaf = (emb @ emb.T).requires_grad_(True)
    with LargestTensor() as mode:
        build_loss("supap", chunk_size=2)(leaf, rel, valid).backward()
    assert mode.numel <= leaf.numel() < 48 * 3 * 48  # not rows × K × D


def test_recipe_section_selects_and_configures_the_new_losses():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every key below is taken by the chosen loss
        gsoft = loss_from_config({"name": "gsoftbin", "num_bins": 20, "neg_drop": 0.5})
        gbb = loss_from_config({"name": "gblackbox", "lambda_val": 2.0, "margin": 0.0})
        gsup = loss_from_config({"name": "gsupap", "temperature": 0.02, "rho": 50.0})
    assert (type(gsoft).__name__, gsoft.num_bins, gsoft.neg_drop) == (
        "GlobalSoftBinAPLoss",
        20,
        0.5,
    )
    assert (gbb.lambda_val, gbb.margin, gsup.temperature, gsup.rho) == (2.0, 0.0, 0.02, 50.0)
    with pytest.warns(UserWarning, match=r"does not take \['temperature'\]"):
        swapped = loss_from_config({"name": "softbin", "temperature": 0.01})
    assert type(swapped).__name__ == "SoftBinAPLoss"
    with pytest.raises(ValueError, match="unknown key.*num_bin"):
        loss_from_config({"name": "gsoftbin", "num_bin": 20})
