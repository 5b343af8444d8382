"""Retrieval evaluation at validation/test time through the exact metric engine.

The module's ``validation_step``/``test_step`` return ``{"embeddings",
"labels", "indices"}``; this callback collects them, gathers all ranks
(dropping duplicates by index), and rank 0 computes, with the blocked exact
engine (``rl_gap.metrics.functional``): gAP, mAP, mAP@k, R@k, R@P90, global
F1g / per-query F1q, and the threshold protocol of the gSAP paper (§C.3:
thresholds fitted on a random half of the classes, reported on the other
half, each half ranked as its own problem, logged as ``protocol_*``). With a
query subset (iNaturalist: 4 per class) R@k is still over every image
(``evaluation_metrics``). Values, or rank 0's error, are broadcast so every
rank logs the same numbers or fails with it (``ModelCheckpoint`` may monitor
``val/gap`` when validation is a held-out split, see ``selection.py``).
With ``plots=True`` it also saves the global precision-recall curve and the
histogram of per-query optimal thresholds against the shared threshold
(the paper's Figure 4) as PNGs in the run directory and sends them to W&B.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from rl_gap import dist
from rl_gap.callbacks.plots import save_consistency_plots, send_plots
from rl_gap.callbacks.selection import guard_model_selection
from rl_gap.metrics.distractor import distractor_metrics
from rl_gap.metrics.functional.arguments import check_block_size
from rl_gap.metrics.functional.sharding import Shard, process_group_shard
from rl_gap.metrics.functional.suite import check_suite_arguments, evaluate_embeddings
from rl_gap.metrics.knn import leave_one_out_knn_accuracy

log = logging.getLogger(__name__)


def _engine_problem(embeddings: torch.Tensor, labels: torch.Tensor, query_positions):
    """``evaluate_embeddings`` arguments of an evaluation split: every item a leave-one-out
    query (``query_positions`` None), or those rows as queries against the whole split."""
    if query_positions is None:
        return {"queries": embeddings, "query_labels": labels, "exclude_self": True}
    query_positions = query_positions.to(embeddings.device)
    return {
        "queries": embeddings[query_positions],
        "database": embeddings,
        "query_labels": labels[query_positions],
        "database_labels": labels,
        "query_index": query_positions.cpu(),
    }


def retrieval_state(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    query_positions: torch.Tensor | None = None,
    block_size: int = 2048,
    shard: Shard | None = None,
):
    """Exact retrieval state of an evaluation split (distractor queries in their own group;
    ``evaluate_embeddings``): ``query_positions=None`` is leave-one-out over every item,
    otherwise those rows are the queries against the whole split, each without itself."""
    _, state = evaluate_embeddings(
        **_engine_problem(embeddings, labels, query_positions), ks=(), precisions=(),
        ceiling=False, block_size=block_size, shard=shard, return_state=True,
    )  # fmt: skip
    return state


def evaluation_metrics(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    query_positions: torch.Tensor | None = None,
    *,
    ks: tuple[int, ...] = (1, 5, 10),
    precisions: tuple[float, ...] = (0.9,),
    map_at: tuple[int, ...] = (),
    protocol_seed: int = 0,
    block_size: int = 2048,
    shard: Shard | None = None,
    ceiling: bool | None = None,
):
    """Metrics of an evaluation split as the papers report them; returns ``(metrics, state)``.

    ``evaluate_embeddings`` with the threshold protocol (NaN when it cannot be built,
    e.g. one class in a tiny split) and R@k over *every* item of the split as a
    leave-one-out query, as in prior work (iNaturalist: all 136,093 test images),
    whatever the query subset (``query_positions``; None: every item). ``shard``:
    the processes split each engine pass's blocks (``rl_gap.metrics.functional.sharding``).
    ``ceiling``: the consistency ceiling C and efficiency gAP / C (``ceiling``, ``efficiency``,
    ...; None: when the split has at most 2e6 positive pairs, as ``evaluate_embeddings``).
    """
    return evaluate_embeddings(
        **_engine_problem(embeddings, labels, query_positions), ks=ks, precisions=precisions,
        map_at=map_at, ceiling=ceiling, protocol=True, seed=protocol_seed, block_size=block_size,
        shard=shard, recall_over_database=query_positions is not None,
        protocol_failure="nan", return_state=True,
    )  # fmt: skip


class RetrievalEvaluation(Callback):
    """Embed the evaluation split, report retrieval metrics, plot consistency curves.

    Args:
        plots: save/log the global PR curve and the per-query threshold histogram.
        map_at: cut-offs k for mAP@k.
        ks: cut-offs k for R@k.
        precision: precision level of R@P (0.9 -> ``r@p90``).
        protocol_seed: seed of the class split of the threshold protocol.
        block_size: GEMM block of the metric engine.
        max_plot_points: PR-curve points kept for plotting.
        sharded: under DDP, every rank scores and counts its share of the engine's
            blocks and the exact counts are summed (``sharding.py``): the metrics
            equal one process's, at ~1/W of the scoring work per rank. False: rank 0
            scores every pair. Distractor-role tasks (``evaluation_roles``) are
            always scored on rank 0.
        knn_k, knn_temperature: online weighted kNN (``knn_top1``/``knn_top5``): each
            evaluated item classified by its ``knn_k`` nearest other items of the split
            (leave-one-out; the split's classes need not be the training classes; an
            item alone in its class is not scored); ``knn_k=0`` turns it off.
        ceiling: also log the consistency ceiling C (``<stage>/ceiling``) and the
            efficiency gAP / C (``<stage>/efficiency``); None: when the split has at most
            2e6 positive pairs (C costs O(P log P) for P positive pairs).
    """

    def __init__(
        self,
        plots: bool = True,
        map_at: tuple[int, ...] = (100,),
        ks: tuple[int, ...] = (1, 5, 10),
        precision: float = 0.9,
        protocol_seed: int = 0,
        block_size: int = 2048,
        max_plot_points: int = 2000,
        sharded: bool = True,
        knn_k: int = 20,
        knn_temperature: float = 0.07,
        ceiling: bool | None = None,
    ) -> None:
        if knn_k < 0 or knn_temperature <= 0:
            raise ValueError(
                f"need knn_k >= 0 and knn_temperature > 0, got {knn_k}, {knn_temperature}"
            )
        self.knn_k, self.knn_temperature = int(knn_k), float(knn_temperature)
        self.plots = plots
        self.ceiling = ceiling
        self.sharded = bool(sharded)
        # checked here, at construction, not after the first training epoch
        self.ks, (self.precision,), self.map_at, _ = check_suite_arguments(ks, (precision,), map_at)
        self.protocol_seed = protocol_seed
        self.block_size = check_block_size(block_size)
        self.max_plot_points = max_plot_points
        self._outputs: list[dict[str, torch.Tensor]] = []
        self.last_metrics: dict[str, float] = {}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":  # say what validation is; never select checkpoints on test
            guard_model_selection(trainer)

    # ---------------------------------------------------------------- collect
    def _reset(self, *_: Any) -> None:
        self._outputs = []

    on_validation_epoch_start = _reset
    on_test_epoch_start = _reset

    def _collect(self, outputs: Any) -> None:
        if not isinstance(outputs, dict) or "embeddings" not in outputs:
            raise ValueError(
                "RetrievalEvaluation needs validation/test steps returning "
                "{'embeddings', 'labels', 'indices'}"
            )
        self._outputs.append({k: outputs[k].detach() for k in ("embeddings", "labels", "indices")})

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ):
        if not trainer.sanity_checking:
            self._collect(outputs)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._collect(outputs)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._evaluate(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._evaluate(trainer, pl_module, "test")

    # --------------------------------------------------------------- evaluate
    def _gathered(self, pl_module: L.LightningModule):
        device = pl_module.device
        if self._outputs:
            emb = torch.cat([o["embeddings"] for o in self._outputs]).float()
            labels = torch.cat([o["labels"] for o in self._outputs]).long()
            indices = torch.cat([o["indices"] for o in self._outputs]).long()
        else:  # a rank may get no evaluation batch
            emb = torch.zeros(0, pl_module.encoder.dim if hasattr(pl_module, "encoder") else 1)
            labels = indices = torch.zeros(0, dtype=torch.long)
        emb, labels, indices = (t.to(device) for t in (emb, labels, indices))
        self._outputs = []
        emb, labels, indices = (dist.gather_no_grad(t) for t in (emb, labels, indices))
        return dist.unique_by_index(indices, emb, labels, indices)

    def _query_positions(self, trainer: L.Trainer, stage: str, indices: torch.Tensor):
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is None or not hasattr(datamodule, "query_indices"):
            return None
        wanted = datamodule.query_indices("val" if stage == "val" else "test")
        if wanted is None:
            return None
        return torch.nonzero(torch.isin(indices.cpu(), wanted)).flatten()

    def _roles(self, trainer: L.Trainer, stage: str, indices: torch.Tensor):
        """Query/database/background role per gathered item of a distractor-query task
        (``rl_gap.data.distractor_sets``), or None for a leave-one-out split."""
        roles_of = getattr(getattr(trainer, "datamodule", None), "evaluation_roles", None)
        roles = None if roles_of is None else roles_of("val" if stage == "val" else "test")
        return None if roles is None else roles[indices.cpu()]

    def _evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        emb, labels, indices = self._gathered(pl_module)
        metrics: dict[str, float] = {}
        error: BaseException | None = None
        # Every rank holds the same gathered set: sharded, each scores its share of
        # the blocks (the same inputs on every rank, so a bad input fails everywhere
        # before the engine's first collective).
        roles = self._roles(trainer, stage, indices)
        shard = process_group_shard() if self.sharded and roles is None else None
        if trainer.is_global_zero or shard is not None:
            try:
                if emb.shape[0] < 2:
                    raise ValueError(f"{stage}: need at least 2 embedded items, got {emb.shape[0]}")
                if roles is not None:  # queries vs a database (rl_gap.metrics.distractor)
                    metrics, state = distractor_metrics(
                        emb, labels, roles, ks=self.ks, precisions=(self.precision,),
                        map_at=self.map_at, block_size=self.block_size,
                        score_norm=getattr(trainer.datamodule, "score_norm", None),
                    )  # fmt: skip
                else:
                    queries = self._query_positions(trainer, stage, indices)
                    metrics, state = evaluation_metrics(
                        emb, labels, queries, ks=self.ks, precisions=(self.precision,),
                        map_at=self.map_at, protocol_seed=self.protocol_seed,
                        block_size=self.block_size, shard=shard, ceiling=self.ceiling,
                    )  # fmt: skip
                if self.knn_k > 0 and roles is None and trainer.is_global_zero:
                    knn = leave_one_out_knn_accuracy(
                        emb, labels, k=self.knn_k, temperature=self.knn_temperature
                    )
                    metrics.update({f"knn_{k}": v for k, v in knn.items() if math.isfinite(v)})
                if self.plots and trainer.is_global_zero:
                    shared = self._plot(trainer, state, stage)
                    if shared is not None:  # the histogram's line, as a logged value
                        metrics["threshold_f1g"] = shared
            except Exception as exc:  # every rank must learn of it, or they hang below
                error = exc
        # Rank 0 sends the metrics or its error; the other ranks wait here, so an
        # error on rank 0 must reach them (else they would hang in the next collective).
        message = None if error is None else f"{type(error).__name__}: {error}"
        metrics, message = trainer.strategy.broadcast((metrics, message), src=0)
        if error is not None and trainer.is_global_zero:
            raise error
        if message is not None:  # every rank fails with rank 0's error
            raise RuntimeError(f"{stage} evaluation failed on rank 0: {message}") from error
        if error is not None:
            raise error
        self.last_metrics = {f"{stage}/{k}": v for k, v in metrics.items()}
        for key, value in self.last_metrics.items():
            pl_module.log(key, value, prog_bar=key.endswith(("/gap", "/map")), sync_dist=False)

    # ------------------------------------------------------------------ plots
    def _plot(self, trainer: L.Trainer, state, stage: str) -> float | None:
        """Save and send the plots; return the shared threshold the histogram marks."""
        root = Path(trainer.default_root_dir)
        title = f"{root.parent.name}/{root.name} · {stage} · epoch {trainer.current_epoch}"
        try:
            plots = save_consistency_plots(
                state,
                Path(trainer.log_dir or trainer.default_root_dir) / "plots",
                f"{stage}_epoch{trainer.current_epoch:03d}",
                self.max_plot_points,
                title=title,
                threshold_key=f"{stage}/threshold_f1g",
            )
        except Exception as error:  # plotting must never kill a training run
            log.warning("could not draw the evaluation plots: %s", error)
            return None
        for logger in trainer.loggers:
            if any(c.__name__ == "WandbLogger" for c in type(logger).__mro__):
                send_plots(logger.experiment, plots, stage, trainer.global_step, title)
        return plots.shared_threshold
