"""Retrieval evaluation at validation/test time through the exact metric engine.

The module's ``validation_step``/``test_step`` return ``{"embeddings",
"labels", "indices"}``; this callback collects them, gathers all ranks
(dropping duplicates by index), and rank 0 computes, in one pass of GEMM
blocks (``rl_gap.metrics.functional``): gAP, mAP, mAP@k, R@k, R@P90, global
F1g / per-query F1q, and the threshold protocol of the gSAP paper (§C.3:
thresholds fitted on a random half of the classes, reported on the other
half, logged as ``protocol_*``). Values are broadcast so every rank logs
the same numbers (``ModelCheckpoint`` may monitor ``val/gap``).
With ``plots=True`` it also saves the global precision-recall curve and the
histogram of per-query optimal thresholds against the shared threshold
(the paper's Figure 4) as PNGs in the run directory and sends them to W&B.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from rl_gap.callbacks.curves import global_pr_curve, per_query_best_thresholds
from rl_gap.losses import dist
from rl_gap.metrics.functional.engine import state_from_embeddings
from rl_gap.metrics.functional.protocol import split_classes
from rl_gap.metrics.functional.ranking import global_f1_from_state
from rl_gap.metrics.functional.suite import metrics_from_state, query_groups

log = logging.getLogger(__name__)


def unique_by_index(
    embeddings: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort by dataset index and keep one copy of each (padding samplers repeat items)."""
    order = torch.argsort(indices, stable=True)
    indices = indices[order]
    keep = torch.ones_like(indices, dtype=torch.bool)
    keep[1:] = indices[1:] != indices[:-1]
    order = order[keep]
    return embeddings[order], labels[order], indices[keep]


def retrieval_state(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    query_positions: torch.Tensor | None = None,
    protocol_seed: int = 0,
    block_size: int = 2048,
):
    """Exact retrieval state of an evaluation set, with threshold-protocol query groups.

    ``query_positions=None``: every item is a query against all others
    (leave-one-out). Otherwise those rows are the queries against the whole
    set, each without itself (iNaturalist: 4 queries per class). Both run the
    blocked engine: memory never holds the Q × D matrix.
    """
    _, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    has_positive = (counts[inverse] - 1).cpu() > 0  # another item of the same class exists
    if query_positions is None:
        group, num_groups = query_groups(has_positive, split_classes(labels.cpu(), protocol_seed))
        return state_from_embeddings(
            embeddings, embeddings, labels, labels, exclude_self=True, block_size=block_size,
            query_group=group, num_groups=num_groups,
        )  # fmt: skip
    query_positions = query_positions.to(embeddings.device)
    q_labels = labels[query_positions]
    split = split_classes(q_labels.cpu(), protocol_seed)
    group, num_groups = query_groups(has_positive[query_positions.cpu()], split)
    return state_from_embeddings(
        embeddings[query_positions], embeddings, q_labels, labels, query_index=query_positions,
        block_size=block_size, query_group=group, num_groups=num_groups,
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
    ) -> None:
        self.plots = plots
        self.map_at, self.ks, self.precision = tuple(map_at), tuple(ks), precision
        self.protocol_seed = protocol_seed
        self.block_size = block_size
        self.max_plot_points = max_plot_points
        self._outputs: list[dict[str, torch.Tensor]] = []
        self.last_metrics: dict[str, float] = {}

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
        return unique_by_index(
            dist.gather_no_grad(emb), dist.gather_no_grad(labels), dist.gather_no_grad(indices)
        )

    def _query_positions(self, trainer: L.Trainer, stage: str, indices: torch.Tensor):
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is None or not hasattr(datamodule, "query_indices"):
            return None
        wanted = datamodule.query_indices("val" if stage == "val" else "test")
        if wanted is None:
            return None
        return torch.nonzero(torch.isin(indices.cpu(), wanted)).flatten()

    def _evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        emb, labels, indices = self._gathered(pl_module)
        metrics: dict[str, float] = {}
        if trainer.is_global_zero:
            if emb.shape[0] < 2:
                raise ValueError(f"{stage}: need at least 2 embedded items, got {emb.shape[0]}")
            queries = self._query_positions(trainer, stage, indices)
            state = retrieval_state(emb, labels, queries, self.protocol_seed, self.block_size)
            metrics = metrics_from_state(
                state, self.ks, (self.precision,), self.map_at, ceiling=False, protocol=True
            )
            if self.plots:
                self._plot(trainer, state, stage)
        metrics = trainer.strategy.broadcast(metrics, src=0)
        self.last_metrics = {f"{stage}/{k}": v for k, v in metrics.items()}
        for key, value in self.last_metrics.items():
            pl_module.log(key, value, prog_bar=key.endswith(("/gap", "/map")), sync_dist=False)

    # ------------------------------------------------------------------ plots
    def _plot(self, trainer: L.Trainer, state, stage: str) -> None:
        try:
            paths = save_consistency_plots(
                state,
                Path(trainer.log_dir or trainer.default_root_dir) / "plots",
                f"{stage}_epoch{trainer.current_epoch:03d}",
                self.max_plot_points,
            )
        except Exception as error:  # plotting must never kill a training run
            log.warning("could not draw the evaluation plots: %s", error)
            return
        for logger in trainer.loggers:
            if type(logger).__name__ == "WandbLogger":
                import wandb

                thresholds, _ = per_query_best_thresholds(state)
                logger.experiment.log(
                    {
                        f"{stage}/pr_curve": wandb.Image(str(paths["pr_curve"])),
                        f"{stage}/query_thresholds": wandb.Image(str(paths["thresholds"])),
                        f"{stage}/query_threshold_hist": wandb.Histogram(thresholds.numpy()),
                        "trainer/global_step": trainer.global_step,
                    }
                )


def save_consistency_plots(
    state, folder: Path, stem: str, max_points: int = 2000
) -> dict[str, Path]:
    """Write ``<stem>_pr_curve.png`` and ``<stem>_thresholds.png`` into ``folder``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    precision, recall, _ = global_pr_curve(state)
    step = max(1, len(recall) // max_points)
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.plot(recall[::step].numpy(), precision[::step].numpy())
    ax.set(xlabel="recall (all pairs)", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02))
    ax.set_title("global precision-recall")
    pr_path = folder / f"{stem}_pr_curve.png"
    fig.tight_layout()
    fig.savefig(pr_path, dpi=100)
    plt.close(fig)

    thresholds, _ = per_query_best_thresholds(state)
    _, shared = global_f1_from_state(state)
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.hist(thresholds.numpy(), bins=50, color="tab:blue", alpha=0.8)
    ax.axvline(float(shared), color="tab:red", label="shared (global F1) threshold")
    ax.set(xlabel="per-query F1-optimal threshold", ylabel="queries")
    ax.legend(loc="upper left", fontsize=8)
    th_path = folder / f"{stem}_thresholds.png"
    fig.tight_layout()
    fig.savefig(th_path, dpi=100)
    plt.close(fig)
    return {"pr_curve": pr_path, "thresholds": th_path}
