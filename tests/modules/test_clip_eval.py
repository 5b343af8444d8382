"""Zero-shot classification and retrieval evaluation against independent references."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, balanced_accuracy_score, top_k_accuracy_score

from rl_gap.data.image_text import CLIPDataModuleBase, RetrievalImages, RetrievalTexts
from rl_gap.data.zero_shot import InMemoryClassification
from rl_gap.metrics.zero_shot import true_class_rank, zero_shot_accuracy
from rl_gap.models.clip import tiny_clip_config
from rl_gap.modules.clip_finetune import CLIPFineTuneModule, retrieval_metrics


def brute_force_retrieval(q: np.ndarray, d: np.ndarray, ql: np.ndarray, dl: np.ndarray) -> dict:
    """gAP, mAP and R@k in float64, written plainly (sklearn AP, argsort recall)."""
    scores = q.astype(np.float64) @ d.astype(np.float64).T
    rel = ql[:, None] == dl[None, :]
    out = {"gap": average_precision_score(rel.ravel(), scores.ravel())}
    rows = [i for i in range(len(q)) if rel[i].any()]
    out["map"] = float(np.mean([average_precision_score(rel[i], scores[i]) for i in rows]))
    for k in (1, 5, 10):
        hits = [rel[i, np.argsort(-scores[i], kind="stable")[:k]].any() for i in rows]
        out[f"r@{k}"] = float(np.mean(hits))
    return out


# ------------------------------------------------------------ classification
def test_zero_shot_accuracy_matches_sklearn():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(200, 12))
    labels = rng.integers(0, 12, size=200)
    scores[np.arange(200), labels] += 1.0  # better than chance
    out = zero_shot_accuracy(torch.from_numpy(scores), torch.from_numpy(labels))
    classes = np.arange(12)
    assert out["top1"] == pytest.approx(top_k_accuracy_score(labels, scores, k=1, labels=classes))
    assert out["top5"] == pytest.approx(top_k_accuracy_score(labels, scores, k=5, labels=classes))
    assert out["mean_per_class_recall"] == pytest.approx(
        balanced_accuracy_score(labels, scores.argmax(1))
    )


def test_zero_shot_accuracy_known_case_with_ties_pessimistic():
    scores = torch.tensor(
        [
            [0.9, 0.1, 0.0],  # class 0: hit
            [0.5, 0.5, 0.0],  # class 1: tied with class 0 -> not a top-1 hit (pessimistic)
            [0.7, 0.2, 0.1],  # class 2: rank 2 -> top-3 only
            [0.0, 0.3, 0.9],  # class 2: hit
        ]
    )
    labels = torch.tensor([0, 1, 2, 2])
    assert true_class_rank(scores, labels).tolist() == [0, 1, 2, 0]
    out = zero_shot_accuracy(scores, labels, topk=(1, 2, 3))
    assert out == {
        "top1": 0.5,
        "top2": 0.75,
        "top3": 1.0,
        "mean_per_class_recall": pytest.approx((1 + 0 + 0.5) / 3),
    }
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        zero_shot_accuracy(scores, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="NaN"):
        zero_shot_accuracy(torch.full((1, 2), float("nan")), torch.tensor([0]))


# ----------------------------------------------------------------- retrieval
def test_retrieval_metrics_known_answer_and_brute_force():
    # Perfect towers: every caption equals its image's embedding.
    basis = torch.eye(3, dtype=torch.float64)
    image_groups = torch.tensor([0, 1, 2])
    text_groups = torch.tensor([0, 0, 1, 2, 2])
    perfect = retrieval_metrics(basis, basis[text_groups], image_groups, text_groups)
    for direction in ("i2t", "t2i"):
        assert perfect[direction]["gap"] == pytest.approx(1.0)
        assert perfect[direction]["map"] == pytest.approx(1.0)
        assert perfect[direction]["r@1"] == pytest.approx(1.0)
    # A hand-computed case: one image, three captions (2 relevant) scored 0.9, 0.8, 0.7
    # with the irrelevant one in the middle: AP = (1/1 + 2/3) / 2.
    image = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    texts = torch.tensor([[0.9, 0.1], [0.8, 0.6], [0.7, 0.7]], dtype=torch.float64)
    out = retrieval_metrics(image, texts, torch.tensor([0]), torch.tensor([0, 1, 0]))
    assert out["i2t"]["gap"] == pytest.approx((1 + 2 / 3) / 2)
    assert out["i2t"]["map"] == pytest.approx((1 + 2 / 3) / 2)
    # Random embeddings: both directions against the float64 brute force.
    rng = np.random.default_rng(1)
    img = rng.normal(size=(12, 6))
    txt = rng.normal(size=(30, 6))
    ig = np.arange(12)
    tg = rng.integers(0, 12, size=30)
    got = retrieval_metrics(
        torch.from_numpy(img), torch.from_numpy(txt), torch.from_numpy(ig), torch.from_numpy(tg)
    )
    want = {
        "i2t": brute_force_retrieval(img, txt, ig, tg),
        "t2i": brute_force_retrieval(txt, img, tg, ig),
    }
    for direction in ("i2t", "t2i"):
        for key, value in want[direction].items():
            assert got[direction][key] == pytest.approx(value, abs=1e-9), (direction, key)


class TinyEvalData(CLIPDataModuleBase):
    """Evaluation-only data: one retrieval set (groups of 2 captions) and one zero-shot set."""

    def __init__(self, images: torch.Tensor, captions: list[str]) -> None:
        super().__init__(batch_size=4, eval_batch_size=3, num_workers=0)
        self.images, self.captions = images, captions

    def eval_datasets(self):
        n = len(self.images)
        return [
            RetrievalImages(list(self.images), list(range(n)), name="toy"),
            RetrievalTexts(self.captions, [i // 2 for i in range(2 * n)], name="toy"),
            InMemoryClassification(
                list(self.images),
                list(range(n)),
                [c.split(" v")[0] for c in self.captions[::2]],
                ["{}", "a {}"],
                name="toy_cls",
            ),
        ]


def test_module_validation_logs_metrics_equal_to_brute_force():
    """validate() logs what a float64 brute force on the module's own encoders gives."""
    torch.manual_seed(0)
    module = CLIPFineTuneModule(
        model_name=None, model_config=tiny_clip_config(width=32, context_length=16)
    )
    images = torch.randn(5, 3, 32, 32)
    names = ["red", "green", "blue", "cyan", "magenta"]
    captions = [f"{n} v{k}" for n in names for k in range(2)]
    data = TinyEvalData(images, captions)
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    trainer.validate(module, datamodule=data)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    module.eval()
    with torch.no_grad():
        img = module.clip.encode_image(images).double().numpy()
        txt = module.clip.encode_text(module.clip.tokenize(captions)).double().numpy()
        prompts = [p.replace("{}", n) for n in names for p in ("{}", "a {}")]
        per_prompt = module.clip.encode_text(module.clip.tokenize(prompts)).double()
    ig, tg = np.arange(5), np.arange(10) // 2
    want = {
        "i2t": brute_force_retrieval(img, txt, ig, tg),
        "t2i": brute_force_retrieval(txt, img, tg, ig),
    }
    for direction, values in want.items():
        for key, value in values.items():
            assert logged[f"val/toy/{direction}_{key}"] == pytest.approx(value, abs=1e-5), key
    classifier = per_prompt.view(5, 2, -1).mean(1)
    classifier = classifier / classifier.norm(dim=1, keepdim=True)
    cls_scores = img @ classifier.numpy().T
    top1 = float(np.mean(cls_scores.argmax(1) == ig))
    assert logged["val/toy_cls/zs_top1"] == pytest.approx(top1)
    assert logged["val/toy_cls/zs_top5"] == pytest.approx(1.0)  # 5 classes
    # online kNN on the image tower: one image per class, no class-mate to classify by
    assert "val/toy_cls/knn_top1" not in logged
