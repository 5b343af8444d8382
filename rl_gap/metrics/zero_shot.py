"""Zero-shot classification accuracy from image–class similarity scores.

The CLIP benchmark's three numbers (the gSAP paper's Tables 3, R, S): top-1,
top-5 accuracy and mean per-class recall (balanced top-1 accuracy). Ties are
resolved pessimistically, like the retrieval metrics (docs/definitions.md): a sample
counts as correct at k only when fewer than k *other* classes score at least
as high as its true class.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def true_class_rank(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per sample, the number of other classes scoring ≥ the true class.

    Args:
        scores: (N, C) float image–class similarities.
        labels: (N,) int64 true classes in [0, C).

    Returns:
        (N,) int64; 0 means a strict top-1 hit.
    """
    if scores.dim() != 2 or labels.dim() != 1 or labels.shape[0] != scores.shape[0]:
        raise ValueError(
            f"scores must be (N, C) and labels (N,), got {tuple(scores.shape)} and "
            f"{tuple(labels.shape)}"
        )
    if scores.shape[0] == 0:
        raise ValueError("zero-shot accuracy of an empty set")
    if not torch.is_floating_point(scores) or torch.isnan(scores).any():
        raise ValueError("scores must be a floating tensor without NaN")
    if labels.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"labels must be integer class indices, got {labels.dtype}")
    if labels.min() < 0 or labels.max() >= scores.shape[1]:
        raise ValueError(f"labels must lie in [0, {scores.shape[1]})")
    true_score = scores.gather(1, labels.long().unsqueeze(1))
    return (scores >= true_score).sum(1) - 1


def zero_shot_accuracy(
    scores: torch.Tensor, labels: torch.Tensor, topk: Sequence[int] = (1, 5)
) -> dict[str, float]:
    """Top-k accuracies and mean per-class recall.

    Args:
        scores: (N, C) similarities (e.g. normalised image embeddings @ class
            text embeddings ᵀ).
        labels: (N,) true classes.
        topk: the k values reported as ``"top{k}"`` (k > C counts every sample).

    Returns:
        ``{"top1": ..., "top5": ..., "mean_per_class_recall": ...}``, floats in
        [0, 1]; the per-class mean is over classes with ≥ 1 sample.
    """
    rank = true_class_rank(scores, labels)
    out = {f"top{k}": float((rank < k).double().mean()) for k in topk}
    hit = (rank == 0).double()
    labels = labels.long()
    counts = torch.bincount(labels, minlength=scores.shape[1]).double()
    # index_add_, not bincount(weights=): CUDA has no deterministic weighted bincount, and
    # these float64 sums of 0/1 are exact in any order.
    hits = torch.zeros(scores.shape[1], dtype=torch.float64, device=hit.device)
    hits.index_add_(0, labels, hit)
    present = counts > 0
    out["mean_per_class_recall"] = float((hits[present] / counts[present]).mean())
    return out
