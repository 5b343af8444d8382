"""torchmetrics classes for exact retrieval metrics from embeddings.

States are the *embeddings and labels* (list states, concatenated across
``update`` calls and gathered across DDP ranks), never the Q x D score matrix;
``compute()`` runs the blocked engine (``evaluate_embeddings``).

Sharing one pass: ``RetrievalMetrics`` computes every metric of the suite in
one engine pass and returns a dict (log it with ``self.log_dict``); the
single-value classes (``GlobalAP``, ``MeanAP``, ``RecallAtK``,
``RecallAtPrecision``, ``MAPAtR``, ``RPrecision``, ``ThresholdProtocol``) are convenient views that each
run their own pass. Prefer one ``RetrievalMetrics`` when you want several.

Two layouts:

- leave-one-out (``leave_one_out=True``, default): every item is a query and a
  database item, self pairs excluded;
- separate sets: ``update(embeddings, labels, is_query)`` with ``is_query`` a
  bool or an (N,) bool tensor routing items to the query or database side.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from rl_gap.metrics.functional.arguments import (
    check_block_size,
    check_k,
    check_precision,
    precision_tag,
)
from rl_gap.metrics.functional.engine_inputs import check_labels
from rl_gap.metrics.functional.suite import check_suite_arguments, evaluate_embeddings

__all__ = [
    "RetrievalMetrics",
    "GlobalAP",
    "MeanAP",
    "RecallAtK",
    "RecallAtPrecision",
    "MAPAtR",
    "RPrecision",
    "ThresholdProtocol",
]


class RetrievalMetrics(Metric):
    """Every retrieval metric from accumulated embeddings, in one engine pass.

    Args:
        leave_one_out: queries are the database (self pairs excluded); else
            items are routed by ``is_query`` in ``update``.
        ks: R@k cut-offs; ``precisions``: R@P levels; ``map_at``: mAP@k cut-offs.
        protocol: add the shared-threshold protocol (``protocol_*`` keys).
        ceiling: compute the consistency ceiling (None: up to 2e6 positive pairs).
        bootstrap: query-bootstrap samples for gAP/mAP intervals (0: none).
        normalize: L2-normalise embeddings (cosine scores).
        block_size: GEMM block size of the engine.

    ``compute()`` returns a dict of float64 0-d tensors (see ``metrics_from_state``).

    Example:
        Leave-one-out over four items in two classes, fed in two batches (the
        same embeddings as ``evaluate_embeddings``' example, so the same
        numbers: gAP 4/6, mAP 3/4, R@1 1/2):

        >>> import torch
        >>> from rl_gap.metrics import RetrievalMetrics
        >>> metric = RetrievalMetrics(ks=(1,))
        >>> metric.update(torch.tensor([[1.0, 0.0], [0.8, 0.6]]), torch.tensor([0, 0]))
        >>> metric.update(torch.tensor([[0.0, 1.0], [0.6, 0.8]]), torch.tensor([1, 1]))
        >>> out = metric.compute()
        >>> {key: round(float(out[key]), 4) for key in ("gap", "map", "r@1")}
        {'gap': 0.6667, 'map': 0.75, 'r@1': 0.5}
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(
        self,
        leave_one_out: bool = True,
        ks: tuple[int, ...] = (1, 5, 10),
        precisions: tuple[float, ...] = (0.9,),
        map_at: tuple[int, ...] = (),
        protocol: bool = False,
        ceiling: bool | None = False,
        bootstrap: int = 0,
        normalize: bool = False,
        block_size: int = 2048,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.leave_one_out = leave_one_out
        # checked at construction, not when compute() runs after training
        self.ks, self.precisions, self.map_at, self.bootstrap = check_suite_arguments(
            ks, precisions, map_at, bootstrap
        )
        self.protocol, self.ceiling = protocol, ceiling
        self.normalize, self.block_size = normalize, check_block_size(block_size)
        self.add_state("query_embeddings", default=[], dist_reduce_fx="cat")
        self.add_state("query_labels", default=[], dist_reduce_fx="cat")
        self.add_state("database_embeddings", default=[], dist_reduce_fx="cat")
        self.add_state("database_labels", default=[], dist_reduce_fx="cat")

    def update(
        self, embeddings: Tensor, labels: Tensor, is_query: Tensor | bool | None = None
    ) -> None:
        """Add a batch: ``embeddings`` (N, dim), ``labels`` (N,) integer classes."""
        if embeddings.ndim != 2:
            raise ValueError(f"embeddings must be (N, dim), got shape {tuple(embeddings.shape)}")
        if labels.ndim != 1 or labels.shape[0] != embeddings.shape[0]:
            raise ValueError(
                f"labels shape {tuple(labels.shape)} does not match embeddings {tuple(embeddings.shape)}"
            )
        earlier = self._as_list(self.query_embeddings) + self._as_list(self.database_embeddings)
        if earlier and earlier[0].shape[1] != embeddings.shape[1]:
            # caught here, at the batch that differs, not as a cat error at compute()
            raise ValueError(
                f"embeddings of dim {embeddings.shape[1]} after earlier updates of dim "
                f"{earlier[0].shape[1]}: every update must use the same embedding dim "
                "(call reset() between models)"
            )
        embeddings = embeddings.detach()
        if self.normalize:
            embeddings = torch.nn.functional.normalize(embeddings.float(), dim=1)
        # integer-valued floats are accepted, 0.5 is refused (never truncated to 0)
        labels = check_labels(labels.detach(), embeddings.shape[0], "labels")
        if self.leave_one_out:
            if is_query is not None:
                raise ValueError("is_query is only for leave_one_out=False")
            self.query_embeddings.append(embeddings)
            self.query_labels.append(labels)
            return
        if is_query is None:
            raise ValueError("leave_one_out=False needs is_query (bool or (N,) bool tensor)")
        mask = torch.as_tensor(is_query, dtype=torch.bool, device=embeddings.device)
        if mask.ndim == 0:
            mask = mask.expand(embeddings.shape[0])
        if mask.shape != labels.shape:
            raise ValueError(f"is_query shape {tuple(mask.shape)} does not match labels")
        self.query_embeddings.append(embeddings[mask])
        self.query_labels.append(labels[mask])
        self.database_embeddings.append(embeddings[~mask])
        self.database_labels.append(labels[~mask])

    @staticmethod
    def _as_list(state: list[Tensor] | Tensor) -> list[Tensor]:
        return state if isinstance(state, list) else [state]

    @staticmethod
    def _cat(state: list[Tensor] | Tensor) -> Tensor | None:
        # List states become one tensor after a DDP sync.
        if isinstance(state, list):
            return dim_zero_cat(state) if state else None
        return state

    def _suite(self) -> dict[str, float]:
        queries = self._cat(self.query_embeddings)
        if queries is None or queries.shape[0] == 0:
            raise ValueError(f"{type(self).__name__}.compute() called with no query embeddings")
        query_labels = self._cat(self.query_labels)
        if self.leave_one_out:
            database, database_labels = queries, query_labels
        else:
            database = self._cat(self.database_embeddings)
            database_labels = self._cat(self.database_labels)
            if database is None or database.shape[0] == 0:
                raise ValueError(
                    f"{type(self).__name__}.compute() called with no database embeddings"
                )
        return evaluate_embeddings(
            queries, database, query_labels, database_labels, exclude_self=self.leave_one_out,
            ks=self.ks, precisions=self.precisions, map_at=self.map_at, ceiling=self.ceiling,
            protocol=self.protocol, bootstrap=self.bootstrap, block_size=self.block_size,
            device=queries.device,
        )  # fmt: skip

    def compute(self) -> dict[str, Tensor]:
        return {k: torch.tensor(v, dtype=torch.float64) for k, v in self._suite().items()}


class _SingleRetrievalMetric(RetrievalMetrics):
    key: str = ""

    def compute(self) -> Tensor:  # type: ignore[override]
        return torch.tensor(self._suite()[self.key], dtype=torch.float64)


class GlobalAP(_SingleRetrievalMetric):
    """gAP: one AP over every (query, database) pair (gSAP paper §3.1)."""

    key = "gap"

    def __init__(self, leave_one_out: bool = True, **kwargs) -> None:
        super().__init__(leave_one_out, ks=(), precisions=(), **kwargs)


class MeanAP(_SingleRetrievalMetric):
    """mAP (``k=None``) or mAP@k over queries with a positive."""

    def __init__(self, leave_one_out: bool = True, k: int | None = None, **kwargs) -> None:
        k = None if k is None else check_k(k)
        super().__init__(
            leave_one_out, ks=(), precisions=(), map_at=() if k is None else (k,), **kwargs
        )
        self.key = "map" if k is None else f"map@{k}"


class RecallAtK(_SingleRetrievalMetric):
    """R@k: share of queries with a positive among the top k."""

    def __init__(self, leave_one_out: bool = True, k: int = 1, **kwargs) -> None:
        k = check_k(k)
        super().__init__(leave_one_out, ks=(k,), precisions=(), **kwargs)
        self.key = f"r@{k}"


class RecallAtPrecision(_SingleRetrievalMetric):
    """Largest recall at a global threshold with precision >= ``precision``."""

    def __init__(self, leave_one_out: bool = True, precision: float = 0.9, **kwargs) -> None:
        precision = check_precision(precision)
        super().__init__(leave_one_out, ks=(), precisions=(precision,), **kwargs)
        self.key = f"r@p{precision_tag(precision)}"


class MAPAtR(_SingleRetrievalMetric):
    """MAP@R (pytorch-metric-learning's ``mean_average_precision_at_r``): per query
    with R positives, the precision-weighted hits of its top R over R; queries with
    R = 0 skipped (docs/definitions.md for the tie rule)."""

    key = "map@r"

    def __init__(self, leave_one_out: bool = True, **kwargs) -> None:
        super().__init__(leave_one_out, ks=(), precisions=(), **kwargs)


class RPrecision(_SingleRetrievalMetric):
    """R-precision: per query with R positives, the share of positives in its top R;
    queries with R = 0 skipped."""

    key = "r_precision"

    def __init__(self, leave_one_out: bool = True, **kwargs) -> None:
        super().__init__(leave_one_out, ks=(), precisions=(), **kwargs)


class ThresholdProtocol(RetrievalMetrics):
    """Shared-threshold protocol (gSAP paper §C.3): thresholds fitted on a seeded
    half of the query classes; ``compute()`` returns ``{"f1g", "r@p90", "f1q"}``
    on the other half."""

    def __init__(self, leave_one_out: bool = True, precision: float = 0.9, **kwargs) -> None:
        precision = check_precision(precision)
        super().__init__(leave_one_out, ks=(), precisions=(precision,), protocol=True, **kwargs)
        self._tag = f"r@p{precision_tag(precision)}"

    def compute(self) -> dict[str, Tensor]:  # type: ignore[override]
        suite = self._suite()
        keys = ("f1g", self._tag, "f1q")
        return {k: torch.tensor(suite[f"protocol_{k}"], dtype=torch.float64) for k in keys}
