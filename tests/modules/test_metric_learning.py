"""MetricLearningModule, EmbeddingEncoder, retrieval evaluation: checked against plain references."""

import lightning as L
import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, precision_recall_curve

from rl_gap.callbacks.curves import global_pr_curve, per_query_best_thresholds
from rl_gap.callbacks.retrieval import evaluation_metrics, retrieval_state
from rl_gap.data.metric_learning import MNISTDemoDataModule
from rl_gap.metrics.functional.suite import metrics_from_state
from rl_gap.models.encoder import EmbeddingEncoder
from rl_gap.modules import MetricLearningModule

TINY = dict(backbone="rl_gap_convnet", backbone_kwargs={"width": 4}, in_chans=1, dim=8)


def test_encoder_embeddings_are_unit_norm():
    enc = EmbeddingEncoder(**TINY)
    out = enc(torch.randn(5, 1, 28, 28))
    assert out.shape == (5, 8)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(5))
    raw = EmbeddingEncoder("rl_gap_convnet", dim=0, in_chans=1, backbone_kwargs={"width": 4})
    assert raw(torch.randn(2, 1, 28, 28)).shape == (2, raw.backbone.num_features)


def test_unknown_backbone_and_bad_dim():
    with pytest.raises(ValueError, match="unknown timm backbone 'resnet_typo'"):
        EmbeddingEncoder("resnet_typo")
    with pytest.raises(ValueError, match="dim"):
        EmbeddingEncoder(**{**TINY, "dim": -1})


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_backbone_weights_from_local_file(tmp_path, suffix):
    source = EmbeddingEncoder(**TINY)
    state = {k: v.clone() for k, v in source.backbone.state_dict().items()}
    state["classifier.weight"] = torch.randn(10, 16)  # an ImageNet head: ignored
    path = tmp_path / f"w{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save({"state_dict": state}, path)
    loaded = EmbeddingEncoder(**TINY, weights=str(path))
    for k, v in source.backbone.state_dict().items():
        assert torch.equal(loaded.backbone.state_dict()[k], v), k


def test_backbone_weights_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="weights file not found"):
        EmbeddingEncoder(**TINY, weights=str(tmp_path / "missing.pth"))
    wrong = EmbeddingEncoder(**{**TINY, "backbone_kwargs": {"width": 6}})
    torch.save(wrong.backbone.state_dict(), tmp_path / "wrong.pth")
    with pytest.raises(ValueError, match="do not fit the backbone"):
        EmbeddingEncoder(**TINY, weights=str(tmp_path / "wrong.pth"))


def test_global_similarity_matches_plain_cosine():
    torch.manual_seed(0)
    module = MetricLearningModule(**TINY, loss={"name": "gsap", "temperature": 0.05})
    module.eval()
    x, y = torch.randn(6, 1, 28, 28), torch.tensor([3, 1, 3, 2, 1, 3])
    sim, rel, valid = module.global_similarity((x, y))
    feats = module.encoder.head(module.encoder.backbone(x)).double()
    for i in range(6):
        for j in range(6):
            cos = feats[i] @ feats[j] / (feats[i].norm() * feats[j].norm())
            assert abs(float(sim[i, j].detach()) - float(cos)) < 1e-5
            assert bool(rel[i, j]) == (int(y[i]) == int(y[j]))
            assert bool(valid[i, j]) == (i != j)
    loss = module.training_step((x, y, torch.arange(6)), 0)
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_loss_swap_is_one_key():
    assert (
        type(MetricLearningModule(**TINY, loss={"name": "msap"}).loss_fn).__name__
        != type(MetricLearningModule(**TINY, loss={"name": "gsap"}).loss_fn).__name__
    )
    with pytest.raises(ValueError, match="unknown loss"):
        MetricLearningModule(**TINY, loss={"name": "gsapp"})


def _reference_metrics(scores, rel, valid):
    """gAP over all valid pairs and mAP over rows, by scikit-learn (float64)."""
    s, r, v = (
        t.double().numpy() if t.dtype != torch.bool else t.numpy() for t in (scores, rel, valid)
    )
    gap = average_precision_score(r[v], s[v])
    aps = [
        average_precision_score(r[i][v[i]], s[i][v[i]]) for i in range(len(s)) if r[i][v[i]].any()
    ]
    return gap, float(np.mean(aps))


@pytest.mark.parametrize("subset", [False, True])
def test_retrieval_state_matches_sklearn(subset):
    g = torch.Generator().manual_seed(0)
    # dyadic coordinates: every dot product is exact, so ties do not depend on GEMM rounding
    emb = torch.round(torch.randn(40, 6, generator=g, dtype=torch.float64) * 16) / 16
    labels = torch.randint(0, 5, (40,), generator=g)
    queries = torch.tensor([1, 4, 9, 17, 22, 30]) if subset else None
    state = retrieval_state(emb, labels, queries)
    got, _ = evaluation_metrics(emb, labels, queries, ks=(1, 5))
    rows = queries if subset else torch.arange(40)
    scores = emb[rows] @ emb.T
    rel = labels[rows][:, None] == labels[None, :]
    valid = torch.ones_like(rel)
    valid[torch.arange(len(rows)), rows] = False
    gap, map_ = _reference_metrics(scores, rel, valid)
    assert abs(got["gap"] - gap) < 1e-9 and abs(got["map"] - map_) < 1e-9
    assert {"protocol_f1g", "protocol_f1q", "protocol_r@p90", "r@1", "r@p90"} <= set(got)
    # R@k: every item a leave-one-out query, even with a query subset (iNaturalist,
    # as in prior work); brute force with ties against the query.
    all_scores = emb @ emb.T
    all_rel = labels[:, None] == labels[None, :]
    eye = torch.eye(40, dtype=torch.bool)
    for k in (1, 5):
        hits = []
        for i in range(40):
            pos, neg = all_rel[i] & ~eye[i], ~all_rel[i]
            if pos.any():
                hits.append(int((all_scores[i][neg] >= all_scores[i][pos].max()).sum()) < k)
        assert got[f"r@{k}"] == pytest.approx(np.mean(hits), abs=1e-12)
        assert got["num_recall_queries"] == len(hits)
    assert metrics_from_state(state, ks=(1,))["num_queries"] == len(rows)

    precision, recall, thresholds = global_pr_curve(state)
    ref_p, ref_r, ref_t = precision_recall_curve(rel[valid].numpy(), scores[valid].numpy())
    for p, r, t in zip(precision.tolist(), recall.tolist(), thresholds.tolist()):
        k = int(np.argmin(np.abs(ref_t - t)))
        assert abs(ref_t[k] - t) < 1e-6 and abs(ref_p[k] - p) < 1e-9 and abs(ref_r[k] - r) < 1e-9

    best_t, best_f1 = per_query_best_thresholds(state)
    expected_t, expected_f1 = [], []
    for i in range(len(rows)):
        s, r = scores[i][valid[i]], rel[i][valid[i]]
        if not r.any():
            continue
        f1s = [
            (2 * float((r & (s >= t)).sum()) / (float((s >= t).sum()) + float(r.sum())), float(t))
            for t in s[r]
        ]
        f1, t = max(f1s)
        expected_t.append(t)
        expected_f1.append(f1)
    assert np.allclose(best_f1.numpy(), expected_f1, atol=1e-12)
    assert np.allclose(best_t.numpy(), expected_t, atol=1e-6)


def test_validation_callback_end_to_end_matches_sklearn(tmp_path):
    torch.manual_seed(0)
    dm = MNISTDemoDataModule(test_digits=(5, 6, 7), eval_batch_size=200)
    module = MetricLearningModule(**TINY, eval_plots=True)
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, default_root_dir=tmp_path,
        enable_model_summary=False, limit_val_batches=1,
    )  # fmt: skip
    out = trainer.validate(module, datamodule=dm, verbose=False)[0]
    dm.setup("validate")
    x, y = dm.datasets["val"].images[:200], dm.datasets["val"].labels[:200]
    module.eval()
    with torch.no_grad():
        emb = module(x).double()
    scores = emb @ emb.T
    scores = (scores + scores.T) / 2  # mirror pairs tie, as in any exact symmetric GEMM
    rel = y[:, None] == y[None, :]
    valid = ~torch.eye(len(y), dtype=torch.bool)
    gap, map_ = _reference_metrics(scores, rel, valid)
    assert abs(out["val/gap"] - gap) < 1e-4 and abs(out["val/map"] - map_) < 1e-4
    assert {"val/protocol_f1g", "val/protocol_f1q", "val/r@1", "val/r@p90"} <= set(out)
    plots = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert plots == ["val_epoch000_pr_curve.png", "val_epoch000_thresholds.png"]
