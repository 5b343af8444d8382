"""The plumbing every training module shares.

A subclass supplies the encoders and one method, ``global_similarity(batch)``,
returning the (sim, rel, valid) matrices of the *global* batch (use
``self.gather`` / ``self.gather_labels``); the base class owns the loss (from
the registry, configured as a flat ``{name, **kwargs}`` recipe section), the
optimizer and schedule, and logging of the loss's learnable parameters.
"""

from __future__ import annotations

import abc
from typing import Any

import lightning as L
import torch

from rl_gap import dist
from rl_gap.losses import loss_from_config
from rl_gap.optim import (
    build_optimizer,
    build_scheduler,
    check_optimizer_settings,
    param_groups,
)


class RankingModule(L.LightningModule, abc.ABC):
    """Base LightningModule: registry loss on the global batch + optimizer/scheduler.

    Args:
        loss: flat loss section, e.g. ``{"name": "gsap", "temperature": 0.01,
            "neg_drop": 0.9}``; ``--model.loss.name msap`` swaps the loss.
        optimizer: a registered optimizer name (``adamw``, ``sgd``, ``lars``).
        lr: peak learning rate.
        weight_decay: applied to ≥2-D parameters only.
        betas: AdamW betas.
        momentum: SGD/LARS momentum.
        scheduler: ``cosine`` (linear warmup then cosine), ``constant`` or ``none``.
        warmup: warmup length in optimizer steps, or a fraction of all steps if < 1.
        min_lr_ratio: final LR of the cosine as a fraction of ``lr``.
        lr_scales: parameter-name prefix -> LR multiplier (e.g. a slower backbone).
    """

    def __init__(
        self,
        loss: dict[str, Any] | None = None,
        optimizer: str = "adamw",
        lr: float = 1e-4,
        weight_decay: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        momentum: float = 0.9,
        scheduler: str = "cosine",
        warmup: float = 0.0,
        min_lr_ratio: float = 0.0,
        lr_scales: dict[str, float] | None = None,
    ) -> None:
        super().__init__()
        # Before anything is built: `--model.lr nan` fails here, naming the setting.
        check_optimizer_settings(
            optimizer, lr, weight_decay, betas, momentum, scheduler, warmup, min_lr_ratio, lr_scales
        )
        self.loss_config = dict(loss or {"name": "gsap"})
        self.loss_fn = loss_from_config(self.loss_config)
        self.optim_config = dict(
            name=optimizer, lr=lr, weight_decay=weight_decay, betas=betas, momentum=momentum
        )
        self.schedule_config = dict(kind=scheduler, warmup=warmup, min_lr_ratio=min_lr_ratio)
        self.lr_scales = dict(lr_scales or {})

    # ----------------------------------------------------------- global batch
    @staticmethod
    def gather(x: torch.Tensor) -> torch.Tensor:
        """All-gather with gradients (identity on one process)."""
        return dist.gather_with_grad(x)

    @staticmethod
    def gather_labels(x: torch.Tensor) -> torch.Tensor:
        return dist.gather_no_grad(x)

    @abc.abstractmethod
    def global_similarity(
        self, batch: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Return (sim, rel, valid) over the global batch. Subclasses implement."""

    # ---------------------------------------------------------------- training
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        sim, rel, valid = self.global_similarity(batch)
        loss = self.loss_fn(sim, rel, valid)
        self.log("train/loss", loss, prog_bar=True, batch_size=sim.shape[0], sync_dist=False)
        self.log_dict(self.loss_parameter_logs(), batch_size=sim.shape[0])
        return loss

    def loss_parameter_logs(self) -> dict[str, float]:
        """Scalar learnable loss parameters (logit scale, bias), for the dashboard."""
        logs = {}
        if hasattr(self.loss_fn, "extra_logs"):
            for k, v in self.loss_fn.extra_logs().items():
                logs[f"train/loss_{k}"] = float(v)
        else:
            for name, p in self.loss_fn.named_parameters():
                if p.numel() == 1:
                    logs[f"train/loss_{name}"] = float(p.detach())
        return logs

    # --------------------------------------------------------------- optimizer
    def optimizer_modules(self) -> list[torch.nn.Module]:
        """Modules whose trainable parameters the optimizer sees (override to restrict)."""
        return [self]

    def configure_optimizers(self):
        cfg = dict(self.optim_config)
        groups = param_groups(self.optimizer_modules(), cfg["weight_decay"], self.lr_scales)
        optimizer = build_optimizer(
            cfg.pop("name"), groups, lr=cfg.pop("lr"), weight_decay=cfg.pop("weight_decay"), **cfg
        )
        total = int(self.trainer.estimated_stepping_batches) if self._trainer else 1
        scheduler = build_scheduler(optimizer, total_steps=max(1, total), **self.schedule_config)
        if scheduler is None:
            return optimizer
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "lr"},
        }

    # ------------------------------------------------------------------ export
    def configure_callbacks(self):
        """``rl-gap predict`` writes ``<run>/embeddings/<split>/*.npy`` (an
        :class:`~rl_gap.callbacks.embedding_writer.EmbeddingWriter`, unless the trainer has one)."""
        from rl_gap.callbacks.embedding_writer import EmbeddingWriter

        if self._trainer is not None and any(
            isinstance(c, EmbeddingWriter) for c in self.trainer.callbacks
        ):
            return []
        return [EmbeddingWriter()]
