"""Ranking GEMMs run in IEEE float32 whatever the global matmul precision / TF32 switches."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rl_gap.losses import build_loss
from rl_gap.metrics.functional import evaluate_embeddings
from rl_gap.metrics.knn import weighted_knn_scores
from rl_gap.metrics.tail.metric import TailExtrapolatedMAP
from rl_gap.precision import full_precision_similarity, ieee_float32

GEMMS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.baddbmm.default,
    torch.ops.aten.mv.default,
    torch.ops.aten.addmv.default,
    torch.ops.aten.mm.out,
}


class PrecisionRecorder(TorchDispatchMode):
    """Records the global float32 matmul precision at every float32 GEMM (backward included)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in GEMMS and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.float32 for a in args
        ):
            self.seen.append(
                f"{torch.backends.cuda.matmul.fp32_precision}/"
                f"{torch.backends.mkldnn.matmul.fp32_precision}"
            )
        return func(*args, **(kwargs or {}))


IEEE = "ieee/ieee"
# On a GPU machine (`make gpu-check`) the comparisons also run on cuda:0, where TF32 is real.
DEVICES = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.fixture
def coarse_global_precision():
    """What Lightning suggests on A100/H100, plus every TF32 switch on; restored after."""
    previous = torch.get_float32_matmul_precision()
    cudnn = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("medium")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    yield
    torch.set_float32_matmul_precision(previous)
    torch.backends.cudnn.allow_tf32 = cudnn


def test_context_sets_and_restores_global_precision():
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        with ieee_float32():
            assert torch.get_float32_matmul_precision() == "highest"
            assert not torch.backends.cuda.matmul.allow_tf32
            with ieee_float32():  # re-entrant
                assert torch.get_float32_matmul_precision() == "highest"
            assert torch.get_float32_matmul_precision() == "highest"
        assert torch.get_float32_matmul_precision() == "medium"
        assert torch.backends.mkldnn.matmul.fp32_precision == "bf16"
        # the per-backend API, mixed with the legacy one: restored per backend
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.mkldnn.matmul.fp32_precision = "ieee"
        with ieee_float32():
            assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        assert torch.backends.mkldnn.matmul.fp32_precision == "ieee"
    finally:
        torch.set_float32_matmul_precision(previous)


def data(n: int = 48, d: int = 16, seed: int = 0, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) // 4
    emb = torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=1)
    return emb.to(device), labels.to(device)


LOSSES = [
    ("gsap", {"impl": "fast", "neg_drop": 0.5}),
    ("gsap", {"impl": "exact"}),
    ("msap", {"neg_drop": 0.3}),
    ("infonce", {"symmetric": True}),
    ("siglip", {}),
    ("supap", {}),
    ("gsoftbin", {}),
    ("blackbox", {}),
]


def everything(device: str = "cpu") -> dict:
    """Every loss value/gradient and metric the test compares, from one embedding batch."""
    emb, labels = data(device=device)
    out: dict = {}
    valid = ~torch.eye(len(labels), dtype=torch.bool, device=device)
    rel = (labels[:, None] == labels[None, :]) & valid
    for name, kwargs in LOSSES:
        x = emb.clone().requires_grad_(True)
        loss_fn = build_loss(name, **kwargs)
        loss = loss_fn(full_precision_similarity(x), rel, valid)
        loss.backward()
        out[f"{name}{kwargs}"] = (loss.detach(), x.grad)
    out["eval"] = evaluate_embeddings(emb, emb, labels, labels, exclude_self=True, block_size=16)
    out["knn"] = weighted_knn_scores(emb[:10], emb[10:], labels[10:], num_classes=12, k=5)
    tail = TailExtrapolatedMAP(gallery_size=10_000, k=10, estimator="count", n_boot=10)
    tail.update(queries=emb[:6], positives=emb[6:12], positive_query=torch.arange(6, device=device))
    tail.update(distractors=emb[12:])
    out["tail"] = tail.compute()
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_every_ranking_gemm_runs_in_ieee_float32(coarse_global_precision, device):
    before = (
        torch.backends.cuda.matmul.fp32_precision,
        torch.backends.mkldnn.matmul.fp32_precision,
    )
    assert before == ("tf32", "bf16")
    recorder = PrecisionRecorder()
    with recorder:
        everything(device)
    assert len(recorder.seen) > 20  # losses' backward, engine blocks, kNN, tail scoring
    assert set(recorder.seen) == {IEEE}
    # the global setting is back for the encoder
    after = (torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision)
    assert after == before


@pytest.mark.parametrize("device", DEVICES)
def test_values_do_not_depend_on_global_precision(coarse_global_precision, device):
    coarse = everything(device)
    torch.set_float32_matmul_precision("highest")
    exact = everything(device)
    assert coarse.keys() == exact.keys()
    for key, value in exact.items():
        other = coarse[key]
        if isinstance(value, tuple):
            for a, b in zip(value, other, strict=True):
                assert torch.equal(a, b), key
        elif isinstance(value, dict):
            for k in value:
                assert torch.equal(torch.as_tensor(value[k]), torch.as_tensor(other[k])) or (
                    value[k] != value[k] and other[k] != other[k]
                ), (key, k)
        else:
            assert torch.equal(value, other), key
