"""Float32 ranking under bf16 autocast: every registered loss × every training module.

Under ``torch.autocast("cpu", torch.bfloat16)`` (what ``precision: bf16-mixed``
runs a training step in) a module's similarity matrix must come out float32,
and the loss value and its gradient w.r.t. the embeddings must match a float64
brute-force reference to the float32 contract.

Tolerances. A float32 similarity carries a rounding error of about
``E · 2^-24 ≈ 1e-7`` (E = embedding width); the losses amplify it by at most
``1/τ`` (τ = 0.05 here, 1/τ = 20) and sum many such terms with random signs,
so float32 values and gradients land within ~1e-6 (relative) of float64.
bf16 resolves a cosine only to 2^-8 ≈ 4e-3, which puts the gradient 1e-3–1e-1
off. ``RTOL = 1e-4`` sits two orders above the first and at least one below
the second.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

from rl_gap.losses import available_losses, build_loss, smoothed_ap_exact, smoothed_ap_rows
from rl_gap.modules import MetricLearningModule
from rl_gap.modules.clip_finetune import CLIPFineTuneModule
from rl_gap.modules.moco_v3 import MoCoV3Module

RTOL = 1e-4
TAU = 0.05
LOG_10 = math.log(10.0)
BF16 = dict(device_type="cpu", dtype=torch.bfloat16)


# ------------------------------------------------------------ float64 references
# Each AP surrogate is a function of one ranked list (1-D scores, bool positives);
# the per-query and global drivers below turn it into a loss over (sim, rel, valid).
def _flat_sap(scores: torch.Tensor, positive: torch.Tensor, tau: float) -> torch.Tensor:
    """Smoothed AP of one list, dense, self-comparison masked out (no 1/2 trick)."""
    diff = (scores.unsqueeze(0) - scores.unsqueeze(1)) / tau  # [i, j] = (s_j - s_i)/τ
    sig = torch.sigmoid(diff) * (1 - torch.eye(scores.numel(), dtype=scores.dtype))
    rank_pos = 1 + (sig * positive.to(scores.dtype)).sum(1)
    rank_all = 1 + sig.sum(1)
    return (rank_pos / rank_all)[positive].mean()


def _softbin_list(scores, positive, num_bins=10, sim_range=(-1.0, 1.0)):
    """FastAP with triangular bins over the similarity range, dense (L × n kernel)."""
    low, high = sim_range
    width = (high - low) / num_bins  # num_bins intervals, num_bins + 1 centres (FastAP)
    centres = high - width * torch.arange(num_bins + 1, dtype=scores.dtype)
    kernel = (1 - (scores.clamp(low, high)[None, :] - centres[:, None]).abs() / width).clamp(min=0)
    hist, hist_pos = kernel.sum(1), (kernel * positive.to(scores.dtype)).sum(1)
    cum, cum_pos = hist.cumsum(0), hist_pos.cumsum(0)
    terms = torch.where(cum > 0, hist_pos * cum_pos / cum.clamp(min=1e-300), 0.0)
    return terms.sum() / positive.sum()


def _ge_counts(scores: torch.Tensor, among: torch.Tensor) -> torch.Tensor:
    """For every item i: |{j in among : s_j >= s_i}| (brute-force comparisons)."""
    return ((scores[None, :] >= scores[:, None]) & among[None, :]).sum(1).to(scores.dtype)


class _BlackboxRankRef(torch.autograd.Function):
    """rk/n with the blackbox backward −(r̃(s) − r̃(s + λg))/λ, by brute force."""

    @staticmethod
    def forward(ctx, scores, lam):
        everyone = torch.ones_like(scores, dtype=torch.bool)
        ranks = _ge_counts(scores, everyone) / scores.numel()
        ctx.save_for_backward(scores, ranks)
        ctx.lam = lam
        return ranks

    @staticmethod
    def backward(ctx, grad):
        scores, ranks = ctx.saved_tensors
        everyone = torch.ones_like(scores, dtype=torch.bool)
        perturbed = _ge_counts(scores + ctx.lam * grad, everyone) / scores.numel()
        return (perturbed - ranks) / ctx.lam, None


def _blackbox_list(scores, positive, lambda_val=4.0, margin=0.02):
    shifted = scores - margin * positive.to(scores.dtype)
    ranks = _BlackboxRankRef.apply(shifted, lambda_val) * scores.numel()
    rank_pos = _ge_counts(shifted.detach(), positive)
    return (rank_pos / ranks)[positive].mean()


def _supap_list(scores, positive, temperature=0.01, rho=100.0, offset=1.44, margin=0.05):
    rank_pos = _ge_counts(scores.detach(), positive)[positive]
    t = scores[~positive][None, :] - scores[positive][:, None]  # (P, N), s_j − s_k
    sig = torch.sigmoid(t / temperature)
    band = sig + 0.5 if margin > 0 else sig
    h = torch.where(t <= 0, sig, torch.where(t <= margin, band, rho * t + offset))
    return (rank_pos / (rank_pos + h.sum(1))).mean()


def _keep_after_drop(scores: torch.Tensor, positive: torch.Tensor, rate: float) -> torch.Tensor:
    """Mask of the list after dropping the floor(rate·N) lowest negatives."""
    neg_idx = (~positive).nonzero().squeeze(1)
    n_drop = math.floor(neg_idx.numel() * rate + 1e-9)
    keep = torch.ones_like(positive)
    order = sorted(neg_idx.tolist(), key=lambda j: (float(scores[j]), j))
    keep[order[:n_drop]] = False
    return keep


def _global_loss(list_ap, sim, rel, valid, neg_drop=0.0, **kwargs):
    scores, positive = sim[valid], rel[valid]  # row-major flat list
    keep = _keep_after_drop(scores.detach(), positive, neg_drop)
    return 1 - list_ap(scores[keep], positive[keep], **kwargs)


def _per_query_loss(list_ap, sim, rel, valid, neg_drop=0.0, symmetric=False, **kwargs):
    def one_direction(s, r, v):
        aps = []
        for q in range(s.shape[0]):
            if not bool((r[q] & v[q]).any()):
                continue
            scores, positive = s[q][v[q]], r[q][v[q]]
            keep = _keep_after_drop(scores.detach(), positive, neg_drop)
            aps.append(list_ap(scores[keep], positive[keep], **kwargs))
        return torch.stack(aps).mean()

    ap = one_direction(sim, rel, valid)
    if symmetric:
        ap = 0.5 * (ap + one_direction(sim.T, rel.T, valid.T))
    return 1 - ap


def ref_gsap(sim, rel, valid, temperature, neg_drop=0.0, **_):
    return _global_loss(_flat_sap, sim, rel, valid, neg_drop, tau=temperature)


def ref_msap(sim, rel, valid, temperature, neg_drop=0.0, symmetric=False, **_):
    return _per_query_loss(_flat_sap, sim, rel, valid, neg_drop, symmetric, tau=temperature)


def ref_infonce(sim, rel, valid, temperature, symmetric=False, **_):
    def one_direction(s, r, v):
        losses = []
        for q in range(s.shape[0]):
            if not bool((r[q] & v[q]).any()):
                continue
            logits = s[q][v[q]] / temperature
            log_prob = logits - torch.logsumexp(logits, 0)
            losses.append(-log_prob[r[q][v[q]]].mean())
        return torch.stack(losses).mean()

    loss = one_direction(sim, rel, valid)
    if symmetric:
        loss = 0.5 * (loss + one_direction(sim.T, rel.T, valid.T))
    return loss


def ref_siglip(sim, rel, valid, init_log_scale=LOG_10, init_bias=-10.0, **_):
    z = rel.to(sim.dtype) * 2 - 1
    logits = sim * math.exp(init_log_scale) + init_bias
    per_pair = -torch.log(torch.sigmoid(z * logits)) * valid.to(sim.dtype)
    return per_pair.sum() / sim.shape[0]


def _surrogate(list_ap, global_ranking):
    def reference(sim, rel, valid, neg_drop=0.0, symmetric=False, **kwargs):
        if global_ranking:
            return _global_loss(list_ap, sim, rel, valid, neg_drop, **kwargs)
        return _per_query_loss(list_ap, sim, rel, valid, neg_drop, symmetric, **kwargs)

    return reference


def _calibration(sim, rel, valid, pos_margin=0.9, neg_margin=0.6):
    """ROADMAP's calibration: mean non-zero positive hinge + mean non-zero negative hinge."""
    pos = (pos_margin - sim[rel & valid]).clamp(min=0)
    neg = (sim[~rel & valid] - neg_margin).clamp(min=0)
    return sum(h.sum() / max(int((h > 0).sum()), 1) for h in (pos, neg))


def _roadmap(global_ranking):
    ap_term = _surrogate(_supap_list, global_ranking)

    def reference(sim, rel, valid, pos_margin=0.9, neg_margin=0.6, calibration_weight=1.0, **kw):
        calib = _calibration(sim, rel, valid, pos_margin, neg_margin)
        return ap_term(sim, rel, valid, **kw) + calibration_weight * calib

    return reference


REFERENCES: dict[str, Callable[..., torch.Tensor]] = {
    "gsap": ref_gsap,
    "msap": ref_msap,
    "infonce": ref_infonce,
    "siglip": ref_siglip,
    "softbin": _surrogate(_softbin_list, False),
    "gsoftbin": _surrogate(_softbin_list, True),
    "blackbox": _surrogate(_blackbox_list, False),
    "gblackbox": _surrogate(_blackbox_list, True),
    "supap": _surrogate(_supap_list, False),
    "gsupap": _surrogate(_supap_list, True),
    "roadmap": _roadmap(False),
    "groadmap": _roadmap(True),
}

_ALL_CONFIGS = [
    {"name": "gsap", "temperature": TAU, "impl": "exact"},
    {"name": "gsap", "temperature": TAU, "impl": "fast"},
    {"name": "gsap", "temperature": TAU, "impl": "exact", "neg_drop": 0.5},
    {"name": "gsap", "temperature": TAU, "impl": "fast", "neg_drop": 0.5},
    {"name": "msap", "temperature": TAU},
    {"name": "msap", "temperature": TAU, "neg_drop": 0.5, "symmetric": True},
    {"name": "infonce", "temperature": TAU},
    {"name": "infonce", "temperature": TAU, "symmetric": True},
    {"name": "siglip", "init_log_scale": math.log(20.0), "init_bias": -2.0},
    {"name": "softbin", "num_bins": 10},
    {"name": "gsoftbin", "num_bins": 10, "neg_drop": 0.5},
    {"name": "blackbox", "lambda_val": 4.0, "margin": 0.02},
    {"name": "gblackbox", "lambda_val": 4.0, "margin": 0.02},
    {"name": "supap", "temperature": TAU, "symmetric": True},
    {"name": "gsupap", "temperature": TAU},
    {"name": "roadmap", "temperature": TAU, "neg_drop": 0.5},
    {"name": "groadmap", "temperature": TAU, "neg_margin": 0.3},
]
# Losses are registered by importing rl_gap.losses; a reference without its loss
# (not registered in this tree) is skipped, a loss without a reference fails below.
LOSS_CONFIGS = [cfg for cfg in _ALL_CONFIGS if cfg["name"] in available_losses()]


def config_id(cfg: dict) -> str:
    return "-".join(str(v) for k, v in cfg.items() if k != "temperature")


def reference_loss(cfg: dict, sim64, rel, valid) -> torch.Tensor:
    kwargs = {k: v for k, v in cfg.items() if k != "name"}
    return REFERENCES[cfg["name"]](sim64, rel, valid, **kwargs)


def test_every_registered_loss_has_a_float64_reference_and_a_config():
    assert set(available_losses()) <= set(REFERENCES)
    assert {cfg["name"] for cfg in LOSS_CONFIGS} == set(available_losses())


# ------------------------------------------------------------- module harnesses
class Passthrough(nn.Module):
    """Stands in for an encoder: the 'images' are the embeddings themselves."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def unit_rows(n: int, dim: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=gen, dtype=torch.float64)
    return torch.nn.functional.normalize(x, dim=1)


def metric_learning_case(cfg):
    """MetricLearningModule.global_similarity + loss on 24 embeddings of 6 classes."""
    module = MetricLearningModule(
        backbone="rl_gap_convnet", backbone_kwargs={"width": 4}, in_chans=1, dim=8, loss=cfg
    )
    module.encoder = Passthrough()
    emb64 = unit_rows(24, 16, seed=1)
    labels = torch.arange(24) % 6

    def run(emb):
        sim, rel, valid = module.global_similarity((emb, labels, torch.arange(24)))
        return sim, module.loss_fn(sim, rel, valid)

    def reference(emb):
        rel = labels[:, None] == labels[None, :]
        valid = ~torch.eye(24, dtype=torch.bool)
        sim = emb @ emb.T  # exactly symmetric like the float32 matrix: same (i, j)/(j, i) ties
        return reference_loss(cfg, 0.5 * (sim + sim.T), rel, valid)

    return [emb64], run, reference


def clip_case(cfg):
    """CLIPFineTuneModule.global_similarity + loss; two captions share a group."""
    from rl_gap.models.clip import tiny_clip_config

    module = CLIPFineTuneModule(model_name=None, model_config=tiny_clip_config(), loss=cfg)
    groups = torch.arange(20)
    groups[7] = groups[3]  # images 3 and 7 (and their captions) share a group
    image64, text64 = unit_rows(20, 16, seed=2), unit_rows(20, 16, seed=3)

    def run(images, texts):
        module.encode_image = lambda x: x  # type: ignore[method-assign]
        module.encode_text = lambda x: x  # type: ignore[method-assign]
        sim, rel, valid = module.global_similarity(
            {"image": images, "text": texts, "group": groups}
        )
        return sim, module.loss_fn(sim, rel, valid)

    def reference(images, texts):
        rel = groups[:, None] == groups[None, :]
        valid = torch.ones_like(rel)
        return reference_loss(cfg, images @ texts.T, rel, valid)

    return [image64, text64], run, reference


def moco_case(cfg):
    """MoCoV3Module.two_view_loss (both view pairs, loss scale) with identity branches."""
    module = MoCoV3Module(
        backbone="vit_tiny_patch16_224",
        backbone_kwargs=dict(
            img_size=8, patch_size=4, in_chans=1, depth=1, embed_dim=16, num_heads=2
        ),
        hidden_dim=32,
        embed_dim=8,
        loss=cfg,
        retrieval_max_queries=0,
    )
    module.queries = lambda x: 3.0 * x  # type: ignore[method-assign]  (not unit norm)
    module.keys = lambda x: 2.0 * x.detach()  # type: ignore[method-assign]
    scale = module.loss_scale_value()
    x1_64, x2_64 = unit_rows(20, 16, seed=4), unit_rows(20, 16, seed=5)

    def run(x1, x2):
        sim, _ = module.pair_similarity(module.queries(x1), module.keys(x2))
        return sim, module.two_view_loss(x1, x2)

    def reference(x1, x2):
        rel = torch.eye(20, dtype=torch.bool)
        valid = torch.ones_like(rel)
        total = 0.0
        for q, k in ((x1, x2.detach()), (x2, x1.detach())):
            qn = q / q.norm(dim=1, keepdim=True)
            kn = k / k.norm(dim=1, keepdim=True)
            total = total + scale * reference_loss(cfg, qn @ kn.T, rel, valid)
        return total

    return [x1_64, x2_64], run, reference


MODULE_CASES = {"metric_learning": metric_learning_case, "clip": clip_case, "moco_v3": moco_case}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.parametrize("cfg", LOSS_CONFIGS, ids=config_id)
@pytest.mark.parametrize("case", list(MODULE_CASES))
def test_module_ranks_float32_under_bf16_autocast(case, cfg):
    torch.manual_seed(0)
    inputs64, run, reference = MODULE_CASES[case](cfg)
    ref_leaves = [x.clone().requires_grad_() for x in inputs64]
    ref_loss = reference(*ref_leaves)
    ref_grads = torch.autograd.grad(ref_loss, ref_leaves)

    leaves = [x.float().requires_grad_() for x in inputs64]
    with torch.autocast(**BF16):
        sim, loss = run(*leaves)
    grads = torch.autograd.grad(loss, leaves)  # Lightning runs backward outside autocast

    assert sim.dtype == torch.float32
    assert loss.dtype == torch.float32
    assert abs(float(loss.detach()) - float(ref_loss.detach())) <= RTOL * abs(
        float(ref_loss.detach())
    ), (
        float(loss.detach()),
        float(ref_loss.detach()),
    )
    for got, want in zip(grads, ref_grads):
        if want.norm() == 0:  # e.g. a key-only input
            continue
        assert got.dtype == torch.float32
        assert relative_error(got, want) <= RTOL, relative_error(got, want)


# ------------------------------------------------- the smoothed-AP kernels alone
@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_smoothed_ap_kernels_compute_float32_under_autocast(half):
    """The exact Functions accumulate their gradient with matmuls in forward."""
    gen = torch.Generator().manual_seed(7)
    scores64 = torch.rand(12, 30, generator=gen, dtype=torch.float64) * 2 - 1
    positive = torch.rand(12, 30, generator=gen) < 0.2
    positive[:, 0] = True
    valid = torch.ones_like(positive)

    ref_in = scores64.clone().requires_grad_()
    ref_flat = _flat_sap(ref_in.reshape(-1), positive.reshape(-1), TAU)
    ref_rows = torch.stack([_flat_sap(ref_in[r], positive[r], TAU) for r in range(12)]).sum()
    g_flat, g_rows = (torch.autograd.grad(v, ref_in)[0] for v in (ref_flat, ref_rows))

    leaf = scores64.float().requires_grad_()
    with torch.autocast("cpu", dtype=half):
        flat = smoothed_ap_exact(leaf.reshape(-1), positive.reshape(-1), TAU, chunk_size=50)
        rows = smoothed_ap_rows(leaf, positive, valid, TAU, chunk_size=5).sum()
    assert flat.dtype == rows.dtype == torch.float32
    for got, want in ((flat, ref_flat), (rows, ref_rows)):
        assert abs(float(got.detach()) - float(want.detach())) <= RTOL * float(want.detach())
    assert relative_error(torch.autograd.grad(flat, leaf)[0], g_flat) <= RTOL
    assert relative_error(torch.autograd.grad(rows, leaf)[0], g_rows) <= RTOL


def test_a_bf16_similarity_is_ranked_in_float32():
    """A loss handed a bf16 matrix (a third-party module) still computes in float32."""
    sim64 = unit_rows(16, 8, seed=8) @ unit_rows(16, 8, seed=9).T
    rel = torch.eye(16, dtype=torch.bool)
    sim_bf16 = sim64.to(torch.bfloat16)
    exact = sim_bf16.double()  # the bf16 values, represented exactly
    for cfg in LOSS_CONFIGS:
        loss_fn = build_loss(**cfg)
        leaf = sim_bf16.clone().requires_grad_()
        with torch.autocast(**BF16):
            loss = loss_fn(leaf, rel)
        assert loss.dtype == torch.float32, cfg
        want = reference_loss(cfg, exact, rel, torch.ones_like(rel))
        assert abs(float(loss.detach()) - float(want)) <= RTOL * abs(float(want)), cfg
        assert torch.autograd.grad(loss, leaf)[0].dtype == torch.bfloat16


# ------------------------------------------------------ real encoders, autocast
def test_encoders_emit_float32_unit_embeddings_under_autocast():
    from rl_gap.models.clip import tiny_clip_config

    torch.manual_seed(0)
    metric = MetricLearningModule(
        backbone="rl_gap_convnet", backbone_kwargs={"width": 4}, in_chans=1, dim=8
    )
    clip = CLIPFineTuneModule(model_name=None, model_config=tiny_clip_config())
    moco = MoCoV3Module(
        backbone="vit_tiny_patch16_224",
        backbone_kwargs=dict(
            img_size=8, patch_size=4, in_chans=1, depth=1, embed_dim=16, num_heads=2
        ),
        hidden_dim=32,
        embed_dim=8,
        retrieval_max_queries=0,
    )
    images = torch.randn(6, 1, 28, 28)
    with torch.autocast(**BF16):
        sim_ml, _, _ = metric.global_similarity((images, torch.arange(6) % 2, torch.arange(6)))
        out = metric.validation_step((images, torch.arange(6), torch.arange(6)), 0)
        sim_clip, _, _ = clip.global_similarity(
            {
                "image": torch.randn(4, 3, 32, 32),
                "text": ["A", "B", "C", "D"],
                "group": torch.arange(4),
            }
        )
        views = [torch.randn(4, 1, 8, 8), torch.randn(4, 1, 8, 8)]
        sim_moco, _, _ = moco.global_similarity({"views": views})
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16  # autocast really was on
        assert metric.encoder.head(torch.randn(2, 16)).dtype == torch.bfloat16
    assert sim_ml.dtype == torch.float32
    # Self-similarity of a unit vector is 1 to float32 rounding (bf16: 0.996 / 1.0078).
    torch.testing.assert_close(sim_ml.diagonal(), torch.ones(6), rtol=0, atol=1e-6)
    for sim in (sim_clip, sim_moco):  # cosines of two different branches
        assert sim.dtype == torch.float32
        assert float(sim.detach().abs().max()) <= 1 + 1e-6
    assert sim_moco.shape == (8, 8)
    assert out["embeddings"].dtype == torch.float32
    norms = out["embeddings"].double().norm(dim=1)
    torch.testing.assert_close(norms, torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-6)


def test_registration_gives_any_loss_the_precision_contract():
    """A newly registered loss needs no code of its own to rank float32 under autocast."""
    from rl_gap.losses import registry

    seen = {}

    class ProbeLoss(nn.Module):
        def forward(self, sim, rel, valid=None):
            seen["autocast"] = torch.is_autocast_enabled("cpu")
            seen["dtype"] = sim.dtype
            return (sim @ sim.T).sum()  # a matmul: bf16 if autocast were still on

    try:
        registry.register_loss("_autocast_probe")(ProbeLoss)
        loss_fn = build_loss("_autocast_probe")
        with torch.autocast(**BF16):
            out = loss_fn(torch.randn(3, 3, dtype=torch.bfloat16), torch.eye(3, dtype=torch.bool))
    finally:
        registry._LOSSES.pop("_autocast_probe", None)
    assert seen == {"autocast": False, "dtype": torch.float32}
    assert out.dtype == torch.float32


def test_autocast_guard_accepts_devices_without_autocast():
    """Meta tensors (shape inference) have no autocast: the guard must not raise."""
    from rl_gap.precision import full_precision_similarity

    sim = full_precision_similarity(torch.empty(4, 3, device="meta", dtype=torch.bfloat16))
    assert sim.shape == (4, 4) and sim.dtype == torch.float32 and sim.device.type == "meta"
