"""Weighted k-nearest-neighbour classification on frozen features.

The protocol of Wu et al., *Unsupervised Feature Learning via Non-Parametric
Instance Discrimination* (CVPR 2018), as used by DINO and the gSAP paper's
self-supervised evaluation: features are L2-normalised; each query takes its
k most cosine-similar bank items, each neighbour votes for its class with
weight exp(s / T); the prediction is the class with the largest total vote.
Defaults k = 20, T = 0.07.

Ties: between classes with equal vote, the smallest class index wins
(``torch.argmax``/stable sort order); between neighbours at the k-th
similarity, ``torch.topk`` picks arbitrarily (measure-zero for real features).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from rl_gap.dist import unique_by_index
from rl_gap.precision import autocast_disabled


def _check_features(name: str, features: torch.Tensor, labels: torch.Tensor) -> None:
    if features.ndim != 2:
        raise ValueError(f"{name} features must be 2-D (N, D), got shape {tuple(features.shape)}")
    if labels.ndim != 1 or labels.shape[0] != features.shape[0]:
        raise ValueError(
            f"{name} labels must be 1-D with one entry per feature row: features "
            f"{tuple(features.shape)}, labels {tuple(labels.shape)}"
        )
    if features.shape[0] == 0:
        raise ValueError(f"{name} features are empty")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"{name} labels must be integer class ids, got dtype {labels.dtype}")
    if not torch.isfinite(features).all():
        raise ValueError(f"{name} features contain NaN or inf")


def weighted_knn_scores(
    query_features: torch.Tensor,
    bank_features: torch.Tensor,
    bank_labels: torch.Tensor,
    num_classes: int,
    k: int = 20,
    temperature: float = 0.07,
    chunk_size: int = 1024,
    exclude_self: bool = False,
) -> torch.Tensor:
    """Per-class weighted votes of each query's k nearest bank items.

    Args:
        query_features: (Q, D) float features (normalised here).
        bank_features: (N, D) float features of the labelled bank.
        bank_labels: (N,) integer classes in [0, num_classes).
        num_classes: C.
        k: neighbours per query (clamped to N).
        temperature: T in the vote weight exp(cos / T).
        chunk_size: queries scored at once (memory chunk × N).
        exclude_self: the queries are the bank rows (Q = N, same order): query i
            never votes for itself (leave-one-out; k clamped to N - 1).

    Returns:
        (Q, C) votes in the dtype of the features.
    """
    _check_features("query", query_features, torch.zeros(len(query_features), dtype=torch.long))
    _check_features("bank", bank_features, bank_labels)
    if query_features.shape[1] != bank_features.shape[1]:
        raise ValueError(
            f"query and bank feature widths differ: {query_features.shape[1]} vs "
            f"{bank_features.shape[1]}"
        )
    if k < 1 or temperature <= 0:
        raise ValueError(f"need k >= 1 and temperature > 0, got k={k}, temperature={temperature}")
    if bank_labels.min() < 0 or bank_labels.max() >= num_classes:
        raise ValueError(f"bank labels must lie in [0, {num_classes}), got {bank_labels.unique()}")
    if exclude_self and query_features.shape[0] != bank_features.shape[0]:
        raise ValueError(
            f"exclude_self needs the queries to be the bank rows, got {query_features.shape[0]} "
            f"queries and {bank_features.shape[0]} bank items"
        )
    k = min(k, bank_features.shape[0] - int(exclude_self))
    if k < 1:
        raise ValueError("leave-one-out kNN needs at least 2 items")
    if bank_features.dtype in (torch.float16, torch.bfloat16):
        bank_features = bank_features.float()  # score half-precision features in float32
    bank = F.normalize(bank_features, dim=1)
    labels = bank_labels.to(bank.device).long()
    out = []
    for start in range(0, query_features.shape[0], chunk_size):
        queries = F.normalize(query_features[start : start + chunk_size].to(bank), dim=1)
        with autocast_disabled(bank):  # rank float32 similarities under autocast too
            sims = queries @ bank.T
            if exclude_self:
                rows = torch.arange(sims.shape[0], device=sims.device)
                sims[rows, rows + start] = float("-inf")
            sims, idx = sims.topk(k, dim=1)
        weights = (sims / temperature).exp()
        votes = torch.zeros(queries.shape[0], num_classes, dtype=bank.dtype, device=bank.device)
        votes.scatter_add_(1, labels[idx], weights)
        out.append(votes)
    return torch.cat(out)


def weighted_knn_accuracy(
    query_features: torch.Tensor,
    query_labels: torch.Tensor,
    bank_features: torch.Tensor,
    bank_labels: torch.Tensor,
    k: int = 20,
    temperature: float = 0.07,
    num_classes: int | None = None,
    top_k: tuple[int, ...] = (1, 5),
) -> dict[str, float]:
    """Top-k accuracy of the weighted kNN classifier, e.g. ``{"top1": .., "top5": ..}``."""
    _check_features("query", query_features, query_labels)
    if num_classes is None:
        num_classes = int(max(bank_labels.max(), query_labels.max())) + 1
    votes = weighted_knn_scores(
        query_features, bank_features, bank_labels, num_classes, k=k, temperature=temperature
    )
    return topk_accuracy(votes, query_labels.to(votes.device), top_k)


def leave_one_out_knn_accuracy(
    features: torch.Tensor,
    labels: torch.Tensor,
    k: int = 20,
    temperature: float = 0.07,
    top_k: tuple[int, ...] = (1, 5),
) -> dict[str, float]:
    """Weighted kNN accuracy of a labelled set classifying itself, each item by its k
    nearest *other* items: the online kNN of a split whose classes are not the
    training classes (metric-learning test splits, zero-shot images).

    An item alone in its class can never be classified right: it votes for the others
    but is not scored itself (as MAP@R skips a query without positives); ``{"top1":
    nan, ...}`` when no item has a class-mate.

    Args:
        features: (N, D) float features; labels: (N,) integer classes.
    """
    _check_features("query", features, labels)
    # any integer ids (negative, sparse): votes over the classes present only
    classes, labels, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    scored = counts[labels] > 1
    if not bool(scored.any()):
        return {f"top{t}": float("nan") for t in top_k}
    votes = weighted_knn_scores(
        features, features, labels, classes.numel(), k=k, temperature=temperature,
        exclude_self=True,
    )  # fmt: skip
    scored = scored.to(votes.device)
    return topk_accuracy(votes[scored], labels.to(votes.device)[scored], top_k)


def topk_accuracy(scores: torch.Tensor, labels: torch.Tensor, top_k=(1, 5)) -> dict[str, float]:
    """Fraction of rows whose label is among the ``t`` highest scores, for t in ``top_k``.

    Ties resolve towards the smaller class index (stable descending sort).
    """
    order = scores.argsort(dim=1, descending=True, stable=True)
    hits = order == labels.long()[:, None]
    return {
        f"top{t}": float(hits[:, : min(t, scores.shape[1])].any(dim=1).double().mean())
        for t in top_k
    }


class WeightedKNNAccuracy(Metric):
    """Weighted kNN top-k accuracy as a torchmetrics Metric (synced across DDP ranks).

    Feed the labelled bank with ``update(features, labels, bank=True)`` and the
    evaluated queries with ``update(features, labels)``; ``compute()`` returns
    ``{"top1": tensor, "top5": tensor}``. States are concatenated across
    ranks, so every rank classifies against the whole bank. Pass the items'
    dataset ``indices`` with every update to count each item once: a
    ``DistributedSampler`` pads the ranks' shards with repeated items.

    Args:
        k, temperature: see :func:`weighted_knn_scores` (defaults 20, 0.07).
        num_classes: C; inferred from the largest label seen when ``None``.
        top_k: accuracies reported.
        feature_dtype: dtype features are stored in (``torch.float16`` halves
            the bank's memory; scoring runs in float32).
    """

    full_state_update = False
    higher_is_better = True

    def __init__(
        self,
        k: int = 20,
        temperature: float = 0.07,
        num_classes: int | None = None,
        top_k: tuple[int, ...] = (1, 5),
        feature_dtype: torch.dtype = torch.float32,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.k = k
        self.temperature = temperature
        self.num_classes = num_classes
        self.top_k = tuple(top_k)
        self.feature_dtype = feature_dtype
        for prefix in ("bank", "query"):
            for name in ("features", "labels", "indices"):
                self.add_state(f"{prefix}_{name}", default=[], dist_reduce_fx="cat")

    def update(
        self,
        features: torch.Tensor,
        labels: torch.Tensor,
        bank: bool = False,
        indices: torch.Tensor | None = None,
    ) -> None:
        """Add (N, D) ``features`` with (N,) ``labels`` (and optional (N,) dataset ``indices``)."""
        _check_features("bank" if bank else "query", features, labels)
        feats = F.normalize(features.detach().float(), dim=1).to(self.feature_dtype)
        prefix = "bank" if bank else "query"
        getattr(self, f"{prefix}_features").append(feats)
        getattr(self, f"{prefix}_labels").append(labels.detach().long())
        if indices is not None:
            indices = torch.as_tensor(indices, device=feats.device)
            if indices.shape != (feats.shape[0],) or indices.dtype.is_floating_point:
                raise ValueError(
                    f"indices must be ({feats.shape[0]},) integers, got {indices.dtype} "
                    f"{tuple(indices.shape)}"
                )
            getattr(self, f"{prefix}_indices").append(indices.long())

    def rows(self, which: str = "query") -> tuple[torch.Tensor, torch.Tensor]:
        """(features, labels) of ``"bank"``/``"query"``, each item once when indices were given.

        Items are then in dataset-index order, the first copy of a repeated index kept.
        """
        feats = dim_zero_cat(getattr(self, f"{which}_features"))
        labels = dim_zero_cat(getattr(self, f"{which}_labels"))
        state = getattr(self, f"{which}_indices")
        # No indices: an empty list, or after a DDP sync an empty tensor.
        if len(state) == 0 if isinstance(state, list) else state.numel() == 0:
            return feats, labels
        index = dim_zero_cat(state)
        if index.shape[0] != feats.shape[0]:
            raise ValueError(
                f"{which}: {index.shape[0]} indices for {feats.shape[0]} features; pass "
                "indices with every update or with none"
            )
        return unique_by_index(index, feats, labels)

    def is_empty(self, which: str = "query") -> bool:
        """No ``which`` (``"bank"``/``"query"``) features yet (list or, once synced, tensor)."""
        state = getattr(self, f"{which}_features")
        return len(state) == 0 if isinstance(state, list) else state.numel() == 0

    def compute(self) -> dict[str, torch.Tensor]:
        if self.is_empty("bank") or self.is_empty("query"):
            raise ValueError(
                "WeightedKNNAccuracy needs both bank and query features before compute()"
            )
        bank, bank_labels = self.rows("bank")
        queries, query_labels = self.rows("query")
        bank, queries = bank.float(), queries.float()
        num_classes = self.num_classes
        if num_classes is None:
            num_classes = int(max(bank_labels.max(), query_labels.max())) + 1
        votes = weighted_knn_scores(
            queries, bank, bank_labels, num_classes, k=self.k, temperature=self.temperature
        )
        accuracy = topk_accuracy(votes, query_labels, self.top_k)
        return {
            name: torch.tensor(value, dtype=torch.float64, device=votes.device)
            for name, value in accuracy.items()
        }
