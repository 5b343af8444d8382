"""Supervised metric learning: images with class labels, relevance = same class.

The global batch (all ranks) is embedded, the cosine-similarity matrix of the
batch with itself is ranked by the configured loss (gSAP, mSAP, InfoNCE, ...),
self pairs are invalid. Validation and test steps return embeddings, labels
and sample indices; :class:`rl_gap.callbacks.RetrievalEvaluation` (attached by
``configure_callbacks``) turns them into gAP, mAP, R@1, R@P90, F1g, F1q.
"""

from __future__ import annotations

from typing import Any

import torch

from rl_gap.models.encoder import EmbeddingEncoder
from rl_gap.modules.base import RankingModule, compile_in_place, enable_grad_checkpointing
from rl_gap.precision import full_precision_similarity


def same_label_relevance(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rel, valid) of a batch compared with itself.

    Args:
        labels: (B,) integer class labels.

    Returns:
        rel: (B, B) bool, True where the labels match;
        valid: (B, B) bool, False on the diagonal (an image is not its own match).
    """
    rel = labels[:, None] == labels[None, :]
    valid = ~torch.eye(labels.shape[0], dtype=torch.bool, device=labels.device)
    return rel, valid


class MetricLearningModule(RankingModule):
    """timm encoder trained with a ranking loss on same-class relevance.

    Args:
        backbone: timm model name (``resnet50``, ``vit_base_patch16_224``, ``rl_gap_convnet``),
            ``name.tag``, or ``hf-hub:org/repo`` (see :class:`~rl_gap.models.EmbeddingEncoder`).
        dim: embedding size (linear head on the pooled features); 0 = no head.
        weights: local file with pretrained backbone weights; None = random init.
        in_chans: image channels (1 for MNIST).
        backbone_kwargs: extra ``timm.create_model`` arguments.
        pretrained: timm's pretrained weights for ``backbone`` through timm's download and
            cache; None = only for ``hf-hub:`` names.
        grad_checkpointing: activation checkpointing in the timm backbone
            (``set_grad_checkpointing``): less memory, one more forward in backward.
        compile: ``torch.compile`` the encoder (in place; checkpoints keep their keys):
            true (inductor) or ``torch.compile`` options, e.g. ``{backend: cudagraphs}``.
        eval_plots: save (and send to W&B) the global PR curve and the
            per-query-threshold histogram at every evaluation.
        **kwargs: :class:`RankingModule` settings: ``loss``, ``optimizer``, ``lr``,
            ``weight_decay``, ``scheduler``, ``warmup``, ``lr_scales``, ``micro_batch_size``, ...

    Batches are ``(images (B, C, H, W), labels (B,), indices (B,))``.
    """

    def __init__(
        self,
        backbone: str = "resnet50",
        dim: int = 512,
        weights: str | None = None,
        in_chans: int = 3,
        backbone_kwargs: dict[str, Any] | None = None,
        eval_plots: bool = True,
        pretrained: bool | None = None,
        grad_checkpointing: bool = False,
        compile: bool | dict[str, Any] = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()
        self.encoder = EmbeddingEncoder(
            backbone=backbone,
            dim=dim,
            weights=weights,
            in_chans=in_chans,
            backbone_kwargs=backbone_kwargs,
            pretrained=pretrained,
        )
        self.eval_plots = eval_plots
        if grad_checkpointing:
            enable_grad_checkpointing(self.encoder.backbone, backbone)
        compile_in_place([self.encoder], compile)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) images -> (B, dim) unit-norm embeddings."""
        return self.encoder(images)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Frozen-feature evaluation input (``rl-gap knn`` / ``linear-probe``, the online
        kNN of :class:`~rl_gap.callbacks.RetrievalEvaluation`): the unit-norm embedding
        (B, dim) that the loss ranks and retrieval scores."""
        return self(images)

    def global_similarity(
        self, batch: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(sim (B, B) float32 even under bf16 autocast, rel, valid) of the global batch."""
        (local,), _ = self.step_embeddings(batch)
        embeddings = self.gather(local)
        labels = self.gather_labels(batch[1])
        rel, valid = same_label_relevance(labels)
        return full_precision_similarity(embeddings), rel, valid

    def local_similarity(
        self, batch: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """This rank's rows of ``global_similarity``: (sim (n, B), rel, valid), for the sharded loss."""
        labels = batch[1]
        (local,), _ = self.step_embeddings(batch)
        embeddings = self.gather(local)
        all_labels = self.gather_labels(labels)
        rows = self.local_rows(local.shape[0], local.device)
        rel = labels[:, None] == all_labels[None, :]
        valid = torch.ones_like(rel)
        own = torch.arange(local.shape[0], device=rel.device)
        valid[own, own + rows.start] = False  # an image is not its own match
        return full_precision_similarity(local, embeddings), rel, valid

    def batch_rows(self, batch: Any) -> int:
        return int(batch[0].shape[0])

    def encode_rows(self, batch: Any, rows: slice) -> tuple[torch.Tensor]:
        return (self(batch[0][rows]),)

    def _embed_step(self, batch: Any) -> dict[str, torch.Tensor]:
        images, labels, indices = batch[0], batch[1], batch[2]
        return {"embeddings": self(images), "labels": labels, "indices": indices}

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0):
        return self._embed_step(batch)

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0):
        return self._embed_step(batch)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0):
        return self._embed_step(batch)

    def configure_callbacks(self):
        """Attach the retrieval evaluation unless the trainer already has one (from a recipe)."""
        from rl_gap.callbacks.retrieval import RetrievalEvaluation

        if self._trainer is not None and any(
            isinstance(c, RetrievalEvaluation) for c in self.trainer.callbacks
        ):
            return super().configure_callbacks()
        return [*super().configure_callbacks(), RetrievalEvaluation(plots=self.eval_plots)]
