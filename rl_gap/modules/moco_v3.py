"""MoCo v3 self-supervised pretraining with a pluggable ranking loss.

Chen, Xie & He, *An Empirical Study of Training Self-Supervised Vision
Transformers* (ICCV 2021); the gSAP paper (§4, App. C.2) swaps its InfoNCE
for gSAP and keeps everything else.

For two views x1, x2 of a batch, queries come from the online branch
(backbone → projector → predictor) and keys from the momentum branch
(backbone → projector, no gradient). The loss is

    L = ctr(q1, k2) + ctr(q2, k1),

where ``ctr(q, k)`` applies the registry loss to the *global* batch
similarity matrix ``sim = q̂ k̂ᵀ`` (L2-normalised, queries gathered with
gradients, keys gathered without) with ``rel = eye`` (same image), times
``loss_scale``. With ``infonce`` (τ = 0.2, ``symmetric: false``) and the 2τ
scale, ``ctr`` is exactly MoCo v3's ``CrossEntropy(q·kᵀ/τ, arange) · 2τ``:
each rank's rows of the global matrix are MoCo v3's local rows with labels
offset by rank, and averaging the rows of every rank is what DDP's
gradient averaging does in MoCo v3.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.nn import functional as F

from rl_gap.losses import get_loss_class
from rl_gap.metrics.knn import WeightedKNNAccuracy
from rl_gap.models.moco import (
    MoCoEncoder,
    apply_moco_vit_tricks,
    build_mlp,
    create_backbone,
    is_vision_transformer,
    make_momentum_copy,
    momentum_coefficient,
    momentum_update,
)
from rl_gap.modules.base import RankingModule, compile_in_place, enable_grad_checkpointing
from rl_gap.precision import full_precision_normalize, full_precision_similarity

DEFAULT_LOSS = {"name": "infonce", "temperature": 0.2, "symmetric": False}


class MoCoV3Module(RankingModule):
    """MoCo v3 pretraining: online encoder + predictor, momentum encoder, two-view loss.

    Args:
        backbone: timm model name (``vit_small_patch16_224``, ``vit_base_patch16_224``,
            ``resnet50``, ...), randomly initialised.
        backbone_kwargs: extra ``timm.create_model`` arguments (MoCo v3's ViT-S
            uses ``num_heads: 12``; tiny demo models set ``img_size``, ``depth``...).
        projector_layers: Linear layers of the projector; ``None``: 3 for ViTs,
            2 for other backbones (MoCo v3).
        hidden_dim: MLP hidden width (4096).
        embed_dim: output width of projector and predictor (256).
        predictor_layers: Linear layers of the predictor (2).
        predictor_last_bn: non-affine BN at the end of the predictor; ``None``:
            on for ViTs, off for ResNets (MoCo v3's code, as recalled).
        mlp_batchnorm: BatchNorm in the MLPs (MoCo v3: yes; off only for tests
            comparing DDP with one process, since CPU has no SyncBatchNorm).
        momentum: m0, the momentum encoder's initial coefficient (0.99).
        momentum_schedule: ``cosine`` (m0 → 1 over all optimizer steps) or ``constant``.
        freeze_patch_embed: ViT only: fixed random patch projection (MoCo v3's
            ``--stop-grad-conv1``).
        fixed_pos_embed: ViT only: fixed 2-D sin-cos position embedding (MoCo v3's ViTs).
        loss_scale: multiplier of each ``ctr`` term: a float, ``"2tau"`` (2 × the
            loss's temperature, MoCo v3's convention) or ``"auto"`` (``"2tau"``
            for ``infonce``, 1 for every other loss, so ``--model.loss.name gsap``
            alone gives the paper's substitution).
        knn_k, knn_temperature: online weighted-kNN evaluation (20, 0.07).
        retrieval_max_queries: the evaluated images' features are also ranked
            against each other (leave-one-out, relevance = same label) for
            gAP/mAP/R@1; this caps how many (0 disables it).
        grad_checkpointing: activation checkpointing in the timm backbone
            (``set_grad_checkpointing``; the momentum encoder runs without gradient).
        compile: ``torch.compile`` the online encoder, predictor and momentum encoder:
            true (inductor) or ``torch.compile`` options, e.g. ``{backend: cudagraphs}``.
        loss: the loss section; None: InfoNCE with τ = 0.2, one-sided (MoCo v3's).
        lr: peak learning rate (MoCo v3's base 1.5e-4; scale it with the batch).
        weight_decay: applied to ≥2-D parameters only (MoCo v3's 0.1).
        momentum_sgd: the SGD/LARS momentum, which :class:`RankingModule` calls
            ``momentum``: here ``momentum`` is the momentum encoder's coefficient.
        **kwargs: :class:`RankingModule` settings: ``optimizer``, ``betas``, ``scheduler``,
            ``warmup``, ``min_lr_ratio``, ``lr_scales``, ``shard_loss``, ``allow_split_batch``,
            ``micro_batch_size`` (the queries are cached, the keys computed once).
    """

    def __init__(
        self,
        backbone: str = "vit_small_patch16_224",
        backbone_kwargs: dict[str, Any] | None = None,
        projector_layers: int | None = None,
        hidden_dim: int = 4096,
        embed_dim: int = 256,
        predictor_layers: int = 2,
        predictor_last_bn: bool | None = None,
        mlp_batchnorm: bool = True,
        momentum: float = 0.99,
        momentum_schedule: str = "cosine",
        freeze_patch_embed: bool = False,
        fixed_pos_embed: bool = False,
        loss_scale: float | str = "auto",
        knn_k: int = 20,
        knn_temperature: float = 0.07,
        retrieval_max_queries: int = 10000,
        grad_checkpointing: bool = False,
        compile: bool | dict[str, Any] = False,
        loss: dict[str, Any] | None = None,
        lr: float = 1.5e-4,
        weight_decay: float = 0.1,
        momentum_sgd: float = 0.9,
        **kwargs: Any,
    ) -> None:
        # the base's ``momentum`` is the optimizer's: here that is ``momentum_sgd``
        super().__init__(loss=dict(loss or DEFAULT_LOSS), lr=lr, weight_decay=weight_decay,
                         momentum=momentum_sgd, **kwargs)  # fmt: skip
        self.save_hyperparameters()
        # Validate the schedule settings now rather than at the first step.
        momentum_coefficient(0, 1, momentum, momentum_schedule)
        if isinstance(loss_scale, str) and loss_scale not in ("auto", "2tau"):
            raise ValueError(f"loss_scale must be a float, 'auto' or '2tau', got {loss_scale!r}")

        net, feature_dim = create_backbone(backbone, **dict(backbone_kwargs or {}))
        vit = is_vision_transformer(net)
        apply_moco_vit_tricks(net, freeze_patch_embed, fixed_pos_embed)
        projector = build_mlp(
            projector_layers or (3 if vit else 2),
            feature_dim,
            hidden_dim,
            embed_dim,
            last_bn=True,
            batchnorm=mlp_batchnorm,
        )
        self.online = MoCoEncoder(net, projector)
        self.predictor = build_mlp(
            predictor_layers,
            embed_dim,
            hidden_dim,
            embed_dim,
            last_bn=vit if predictor_last_bn is None else predictor_last_bn,
            batchnorm=mlp_batchnorm,
        )
        if grad_checkpointing:
            enable_grad_checkpointing(net, backbone)
        self.momentum_encoder = make_momentum_copy(self.online)
        compile_in_place([self.online, self.predictor, self.momentum_encoder], compile)
        self.base_momentum = momentum
        self.momentum_schedule = momentum_schedule
        self.loss_scale = loss_scale
        self.retrieval_max_queries = retrieval_max_queries
        self.knn = WeightedKNNAccuracy(k=knn_k, temperature=knn_temperature)
        self._momentum_step: int | None = None
        self._total_steps = 1

    # ------------------------------------------------------------- encoders
    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Frozen-feature evaluation input: online backbone features (B, F)."""
        return self.online.features(images)

    def queries(self, images: torch.Tensor) -> torch.Tensor:
        """Online branch: predictor(projector(backbone(x))), (B, E)."""
        return self.predictor(self.online(images))

    @torch.no_grad()
    def keys(self, images: torch.Tensor) -> torch.Tensor:
        """Momentum branch, no gradient: projector(backbone(x)), (B, E)."""
        return self.momentum_encoder(images)

    # ---------------------------------------------------------------- loss
    def loss_scale_value(self) -> float:
        """The factor applied to each view-pair loss (see ``loss_scale``)."""
        if not isinstance(self.loss_scale, str):
            return float(self.loss_scale)
        if self.loss_scale == "auto" and not isinstance(self.loss_fn, get_loss_class("infonce")):
            return 1.0
        logit_scale = getattr(self.loss_fn, "logit_scale", None)
        if callable(logit_scale):  # InfoNCE: τ = 1 / scale (also when learnable)
            return 2.0 / float(torch.as_tensor(logit_scale()).detach())
        temperature = getattr(self.loss_fn, "temperature", None)
        if temperature is None:
            raise ValueError(
                f"loss_scale='2tau' needs a loss with a temperature; "
                f"{type(self.loss_fn).__name__} has none"
            )
        return 2.0 * float(temperature)

    def pair_similarity(
        self, queries: torch.Tensor, keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Global cosine matrix of one view pair and its relevance (same image).

        Args:
            queries: (N_local, E) online outputs (gathered with gradients).
            keys: (N_local, E) momentum outputs (gathered without gradients).

        Returns:
            sim (N_global, N_global), rel = eye (bool).
        """
        # float32 even under bf16/fp16 autocast: bf16 resolves cosines near 1
        # only to ~4e-3, coarser than gSAP's temperature (1e-2 and below).
        q = self.gather(full_precision_normalize(queries, dim=1))
        k = self.gather_labels(full_precision_normalize(keys.detach(), dim=1))
        sim = full_precision_similarity(q, k)
        rel = torch.eye(sim.shape[0], dtype=torch.bool, device=sim.device)
        return sim, rel

    def local_pair_similarity(
        self, queries: torch.Tensor, keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of ``pair_similarity``: local queries against every gathered key.

        Returns:
            sim (N_local, N_global), rel (True at each query's own image).
        """
        q = full_precision_normalize(queries, dim=1)
        k = self.gather_labels(full_precision_normalize(keys.detach(), dim=1))
        sim = full_precision_similarity(q, k)
        rows = self.local_rows(q.shape[0], q.device)
        own = torch.arange(q.shape[0], device=sim.device)
        rel = torch.zeros(sim.shape, dtype=torch.bool, device=sim.device)
        rel[own, own + rows.start] = True
        return sim, rel

    def local_similarity(self, batch: Any):
        """The (sim, rel, valid) of one view pair, this rank's rows (the sharded loss's input)."""
        x1, x2 = self._views(batch)
        sim, rel = self.local_pair_similarity(self.queries(x1), self.keys(x2))
        return sim, rel, None

    def two_view_loss(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        """ctr(q1, k2) + ctr(q2, k1) on the global batch, each scaled by ``loss_scale``.

        Sharded (``shard_loss``): each rank ranks its own queries against all keys.
        """
        (q1, q2), (k1, k2) = self.step_embeddings({"views": [x1, x2]})
        scale = self.loss_scale_value()
        sharded = self.shards_loss()
        total = 0.0
        for q, k in ((q1, k2), (q2, k1)):
            if sharded:
                sim, rel = self.local_pair_similarity(q, k)
                total = total + scale * self.sharded_loss(sim, rel, None)
            else:
                sim, rel = self.pair_similarity(q, k)
                total = total + scale * self.loss_fn(sim, rel, None)
        return total

    def batch_rows(self, batch: Any) -> int:
        return int(self._views(batch)[0].shape[0])

    def encode_rows(self, batch: Any, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Both views' queries of ``rows`` (online encoder and predictor)."""
        x1, x2 = self._views(batch)
        return self.queries(x1[rows]), self.queries(x2[rows])

    def frozen_rows(self, batch: Any, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Both views' momentum keys of ``rows``: computed once, never replayed."""
        x1, x2 = self._views(batch)
        return self.keys(x1[rows]), self.keys(x2[rows])

    def global_similarity(self, batch: dict[str, Any]):
        """Both view pairs as one block-diagonal (2N, 2N) matrix, off-diagonal blocks invalid.

        For inspection and generic tooling; training sums the two view-pair
        losses instead (MoCo v3's ``ctr(q1,k2) + ctr(q2,k1)``).
        """
        x1, x2 = self._views(batch)
        sims = [
            self.pair_similarity(self.queries(a), self.keys(b)) for a, b in ((x1, x2), (x2, x1))
        ]
        n = sims[0][0].shape[0]
        sim = sims[0][0].new_zeros(2 * n, 2 * n)
        rel = torch.zeros(2 * n, 2 * n, dtype=torch.bool, device=sim.device)
        valid = torch.zeros_like(rel)
        for i, (s, r) in enumerate(sims):
            block = slice(i * n, (i + 1) * n)
            sim[block, block] = s
            rel[block, block] = r
            valid[block, block] = True
        return sim, rel, valid

    @staticmethod
    def _views(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        views = batch["views"] if isinstance(batch, dict) else batch[0]
        if len(views) != 2:
            raise ValueError(f"MoCo v3 expects exactly two views per image, got {len(views)}")
        x1, x2 = views
        if x1.shape != x2.shape:
            raise ValueError(
                f"the two views differ in shape: {tuple(x1.shape)} vs {tuple(x2.shape)}"
            )
        return x1, x2

    # ------------------------------------------------------------ training
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x1, x2 = self._views(batch)
        loss = self.two_view_loss(x1, x2)
        self.log("train/loss", loss, prog_bar=True, batch_size=x1.shape[0])
        self.log_dict(self.loss_parameter_logs(), batch_size=x1.shape[0])
        return loss

    def optimizer_modules(self) -> list[torch.nn.Module]:
        # The momentum encoder is frozen (requires_grad=False) and left out explicitly.
        return [self.online, self.predictor, self.loss_fn]

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        # a step/SIGTERM checkpoint is written before this module's on_train_batch_end
        # (callbacks run first): record which step the momentum encoder has caught up with
        checkpoint["moco_momentum_step"] = self._momentum_step

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self._resumed_momentum_step = checkpoint.get("moco_momentum_step")

    def on_train_start(self) -> None:
        step = int(self.trainer.global_step)
        behind = getattr(self, "_resumed_momentum_step", None)
        self._resumed_momentum_step = None
        self._momentum_step = step
        total = self.trainer.estimated_stepping_batches
        if not math.isfinite(total):
            if self.momentum_schedule == "cosine":
                raise ValueError(
                    "the cosine momentum schedule needs a finite run: set trainer.max_epochs "
                    "or trainer.max_steps"
                )
            total = 1
        self._total_steps = max(1, int(total))
        if behind is not None and behind < step:
            # resumed from a checkpoint written before step ``step``'s momentum update:
            # make it now, as the uninterrupted run did, so the resume is exact
            m = momentum_coefficient(
                step, self._total_steps, self.base_momentum, self.momentum_schedule
            )
            momentum_update(self.online, self.momentum_encoder, m)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Update once per optimizer step: with gradient accumulation most
        # batches end without one (global_step unchanged).
        step = int(self.trainer.global_step)
        if self._momentum_step is None:
            self._momentum_step = step - 1
        if step == self._momentum_step:
            return
        self._momentum_step = step
        # MoCo v3 updates with m(t) before iteration t's forward, using the
        # weights after t optimizer steps: same as here, after step t.
        m = momentum_coefficient(
            step, self._total_steps, self.base_momentum, self.momentum_schedule
        )
        momentum_update(self.online, self.momentum_encoder, m)
        self.log("train/momentum", m, batch_size=1)

    # ----------------------------------------------------------- evaluation
    def validation_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0):
        """Dataloader 0: labelled kNN bank; dataloader 1: evaluated images."""
        features = self.features(batch["image"])
        # Dataset indices let the metric count DistributedSampler's padded repeats once.
        self.knn.update(
            features, batch["label"], bank=dataloader_idx == 0, indices=batch.get("index")
        )

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0):
        """Unit-norm backbone features for ``rl-gap predict`` (the kNN / retrieval input)."""
        features = F.normalize(self.features(batch["image"]).float(), dim=1)
        return {"embeddings": features, "labels": batch["label"], "indices": batch["index"]}

    def on_validation_epoch_end(self) -> None:
        if self.knn.is_empty("bank") or self.knn.is_empty("query"):
            rank_zero_warn(
                "MoCoV3Module evaluates with two validation loaders, [kNN bank, queries]; "
                "one is missing or empty, so no kNN/retrieval metrics are logged"
            )
            self.knn.reset()
            return
        accuracy = self.knn.compute()
        self.log_dict({f"val/knn_{k}": v for k, v in accuracy.items()}, sync_dist=False)
        if self.retrieval_max_queries > 0:
            with self.knn.sync_context():
                feats, labels = self.knn.rows("query")
                feats = feats.float()
            self.log_dict(self.retrieval_metrics(feats, labels), sync_dist=False)
        self.knn.reset()

    def retrieval_metrics(self, features: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        """Leave-one-out retrieval among evaluated images (relevance = same label)."""
        from rl_gap.metrics.functional import evaluate_embeddings

        n = min(self.retrieval_max_queries, features.shape[0])
        feats = F.normalize(features[:n], dim=1)
        out = evaluate_embeddings(
            feats, feats, labels[:n], labels[:n], exclude_self=True, ks=(1,), ceiling=False
        )
        return {f"val/{k}": float(v) for k, v in out.items() if k in ("gap", "map", "r@1", "r@p90")}
