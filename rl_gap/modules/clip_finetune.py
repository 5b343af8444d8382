"""CLIP fine-tuning with any registry loss (gSAP paper §4, §B.1, §C.1).

The paper fine-tunes a pretrained OpenCLIP ViT-B/32 on CC12M for 5 epochs and
swaps only the loss. Here the global batch's image–text similarity matrix
(all ranks gathered, with gradients) goes to the loss with ``rel[i, j] =
group[i] == group[j]``: the same sample, or the same caption group when an
image has several captions (or a caption several images). Evaluation reports
zero-shot retrieval in both directions (gAP, mAP, R@1/5/10 through the metric
engine, caption groups as relevance) and zero-shot classification accuracy.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from rl_gap import dist
from rl_gap.data.image_text import RETRIEVAL_IMAGES, RETRIEVAL_TEXTS, ZERO_SHOT
from rl_gap.metrics.functional import evaluate_embeddings
from rl_gap.metrics.functional.sharding import Shard, process_group_shard
from rl_gap.metrics.knn import leave_one_out_knn_accuracy
from rl_gap.metrics.zero_shot import zero_shot_accuracy
from rl_gap.models.clip import CLIPEncoder
from rl_gap.modules.base import RankingModule, compile_in_place
from rl_gap.precision import full_precision_similarity

RECALL_KS = (1, 5, 10)
# The engine reports more (counts, thresholds, F1); these are the paper's columns.
LOGGED_RETRIEVAL_KEYS = ("gap", "map", "r@1", "r@5", "r@10", "r@p90")


def start_loss_scale_from(loss_fn: nn.Module, log_scale: float) -> bool:
    """Set a loss's learnable log logit scale (InfoNCE's ``log_logit_scale``) in place.

    Returns whether the loss had one. SigLIP's scale/bias and gSAP's fixed τ
    are left alone: they are the loss's own (gSAP paper §C.1).
    """
    param = getattr(loss_fn, "log_logit_scale", None)
    if not isinstance(param, nn.Parameter):
        return False
    with torch.no_grad():
        param.fill_(float(log_scale))
    return True


def caption_group_relevance(image_groups: torch.Tensor, text_groups: torch.Tensor) -> torch.Tensor:
    """(I,) and (T,) group ids -> (I, T) bool, True where image and caption share a group."""
    return image_groups.view(-1, 1) == text_groups.view(1, -1)


class CLIPFineTuneModule(RankingModule):
    """Fine-tune an open_clip model with a registry ranking loss.

    Args:
        model_name: bundled open_clip architecture (``"ViT-B-32"``).
        model_config: architecture dict / JSON path instead of a name.
        pretrained: local checkpoint file (open_clip state dict, open_clip
            training checkpoint, or a Lightning checkpoint of this module);
            None = random init. Never downloads.
        loss: the loss section (``{name: gsap, gsap: {temperature: 0.001,
            neg_drop: 0.95}}``); any registered loss works.
        scale_from_pretrained: start a learnable InfoNCE logit scale from the
            checkpoint's ``logit_scale`` (as CLIP fine-tuning continues it).
        lock_image / lock_text: freeze a tower (LiT-style).
        lock_image_unlocked_groups / lock_text_unlocked_layers: keep the last
            layer groups of a locked tower trainable (open_clip's grouping,
            counted from the output: 1 = the projection, 2 = also the last
            block and final norm, ...).
        grad_checkpointing: activation checkpointing in both towers.
        compile: ``torch.compile`` the image tower and the text transformer (in place;
            checkpoints keep their keys): true (inductor) or ``torch.compile`` options.
        lr: peak learning rate (CLIP fine-tuning's small default).
        weight_decay: applied to ≥2-D parameters only (CLIP's 0.1).
        betas: AdamW betas (CLIP's (0.9, 0.98)).
        **kwargs: :class:`RankingModule` settings: ``optimizer``, ``momentum``,
            ``scheduler``, ``warmup``, ``min_lr_ratio``, ``lr_scales``, ``shard_loss``,
            ``micro_batch_size`` (both towers are cached), ``allow_split_batch``.

    Mixed precision is Lightning's (``trainer.precision: bf16-mixed``); the
    similarity matrix the loss ranks is always computed in float32, since
    low-temperature gSAP (τ ≈ 1e-3) needs finer resolution than bf16's.
    """

    def __init__(
        self,
        model_name: str | None = "ViT-B-32",
        model_config: dict[str, Any] | str | None = None,
        pretrained: str | None = None,
        loss: dict[str, Any] | None = None,
        scale_from_pretrained: bool = True,
        lock_image: bool = False,
        lock_image_unlocked_groups: int = 0,
        lock_text: bool = False,
        lock_text_unlocked_layers: int = 0,
        grad_checkpointing: bool = False,
        compile: bool | dict[str, Any] = False,
        lr: float = 1e-5,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.98),
        **kwargs: Any,
    ) -> None:
        super().__init__(loss=loss, lr=lr, weight_decay=weight_decay, betas=betas, **kwargs)
        self.save_hyperparameters()
        self.clip = CLIPEncoder(model_name, model_config, pretrained, grad_checkpointing)
        if lock_image:
            self.clip.lock_image_tower(lock_image_unlocked_groups)
        if lock_text:
            self.clip.lock_text_tower(lock_text_unlocked_layers)
        towers = (getattr(self.clip.model, n, None) for n in ("visual", "transformer", "text"))
        compile_in_place(towers, compile)  # the image tower and the text transformer
        self.loss_scale_from_pretrained = False
        # (class names, templates) -> (text tower version, (C, E) classifier)
        self._zero_shot_cache: dict[tuple, tuple[tuple, torch.Tensor]] = {}
        if scale_from_pretrained and self.clip.pretrained_logit_scale is not None:
            self.loss_scale_from_pretrained = start_loss_scale_from(
                self.loss_fn, self.clip.pretrained_logit_scale
            )
        self._eval_buffers: dict[int, dict[str, list[torch.Tensor]]] = {}

    # ------------------------------------------------------------------ setup
    def setup(self, stage: str) -> None:
        """Hand the model's tokenizer and preprocessing to a CLIP DataModule."""
        super().setup(stage)
        trainer = self._trainer
        datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
        if datamodule is not None and hasattr(datamodule, "configure_for_model"):
            datamodule.configure_for_model(
                self.clip.tokenizer, self.clip.image_size, self.clip.mean, self.clip.std
            )

    # --------------------------------------------------------------- encoding
    def tokens(self, text: torch.Tensor | list[str]) -> torch.Tensor:
        """Batch captions as tokens on this device (tokenizing raw strings here)."""
        if not isinstance(text, torch.Tensor):
            text = self.clip.tokenize(text)
        return text.to(self.device)

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        return self.clip.encode_image(images)

    def encode_text(self, text: torch.Tensor | list[str]) -> torch.Tensor:
        return self.clip.encode_text(self.tokens(text))

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Frozen-feature evaluation input (``rl-gap knn`` / ``linear-probe``, online
        kNN): the image tower's unit-norm embedding (B, E), the vector zero-shot and
        retrieval score."""
        return self.encode_image(images)

    @staticmethod
    def online_knn(features: torch.Tensor, labels: torch.Tensor, prefix: str) -> dict[str, float]:
        """Leave-one-out weighted kNN (k = 20, T = 0.07) of a zero-shot set's image
        features: ``{prefix}knn_top1`` / ``knn_top5`` next to the zero-shot accuracy
        (not logged for a set with one image per class: nothing to classify by)."""
        if features.shape[0] < 2:
            return {}
        out = leave_one_out_knn_accuracy(features, labels)  # NaN: one image per class
        return {f"{prefix}knn_{key}": v for key, v in out.items() if v == v}

    def batch_rows(self, batch: dict[str, Any]) -> int:
        for key in ("image", "text", "group"):
            if key not in batch:
                raise ValueError(f"CLIP batches need 'image', 'text' and 'group'; missing {key!r}")
        return int(batch["image"].shape[0])

    def encode_rows(self, batch: dict[str, Any], rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Both towers' embeddings of ``rows`` (images, captions)."""
        return self.encode_image(batch["image"][rows]), self.encode_text(batch["text"][rows])

    def global_similarity(
        self, batch: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(sim (B, B) float32, rel (B, B) bool, None) over the global batch."""
        (images, texts), _ = self.step_embeddings(batch)
        images = self.gather(images)
        texts = self.gather(texts)
        groups = self.gather_labels(batch["group"].to(self.device))
        sim = full_precision_similarity(images, texts)
        rel = caption_group_relevance(groups, groups)
        return sim, rel, None

    def local_similarity(
        self, batch: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """This rank's image rows against every gathered caption (the sharded loss's input)."""
        (images, texts), _ = self.step_embeddings(batch)
        texts = self.gather(texts)
        local_groups = batch["group"].to(self.device)
        groups = self.gather_labels(local_groups)
        sim = full_precision_similarity(images, texts)
        return sim, caption_group_relevance(local_groups, groups), None

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        if self.shards_loss():
            sim, rel, valid = self.local_similarity(batch)
            loss = self.sharded_loss(sim, rel, valid)
            n = sim.shape[1]  # the global batch (columns)
        else:
            sim, rel, valid = self.global_similarity(batch)
            loss = self.loss_fn(sim, rel, valid)
            n = sim.shape[0]
        with torch.no_grad():
            self.log("train/loss", loss, prog_bar=True, batch_size=n)
            self.log("train/pos_sim", sim[rel].mean(), batch_size=n)
            if not bool(rel.all()):
                self.log("train/neg_sim", sim[~rel].mean(), batch_size=n)
            self.log("train/global_batch", float(n), batch_size=n)
        self.log_dict(self.loss_parameter_logs(), batch_size=n)
        return loss

    # ------------------------------------------------------------- evaluation
    def _eval_loaders(self, stage: str) -> list[Any]:
        loaders = self.trainer.test_dataloaders if stage == "test" else self.trainer.val_dataloaders
        if loaders is None:
            return []
        return list(loaders) if isinstance(loaders, list | tuple) else [loaders]

    def _eval_step(self, batch: dict[str, Any], dataloader_idx: int) -> None:
        buffer = self._eval_buffers.setdefault(dataloader_idx, defaultdict(list))
        if "text" in batch and "image" not in batch:
            emb, labels = self.encode_text(batch["text"]), batch["group"]
        else:
            emb = self.encode_image(batch["image"])
            labels = batch["group"] if "group" in batch else batch["label"]
        buffer["emb"].append(emb.detach().float())
        buffer["label"].append(labels.to(self.device))
        buffer["index"].append(batch["index"].to(self.device))

    def validation_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0):
        self._eval_step(batch, dataloader_idx)

    def test_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0):
        self._eval_step(batch, dataloader_idx)

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0):
        """``rl-gap predict``: caption or image embeddings with group (pair) ids, or
        zero-shot images with class labels (keys read by the embedding writer)."""
        if "text" in batch and "image" not in batch:
            return {"text_embeddings": self.encode_text(batch["text"]),
                    "labels": batch["group"], "indices": batch["index"]}  # fmt: skip
        emb = self.encode_image(batch["image"])
        if "group" in batch:
            return {"image_embeddings": emb, "labels": batch["group"], "indices": batch["index"]}
        return {"embeddings": emb, "labels": batch["label"], "indices": batch["index"]}

    def on_validation_epoch_start(self) -> None:
        self._eval_buffers = {}

    on_test_epoch_start = on_validation_epoch_start

    def _collected(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings and labels of loader ``idx`` from every rank, in dataset order."""
        buffer = self._eval_buffers[idx]
        emb = dist.gather_no_grad(torch.cat(buffer["emb"]))
        labels = dist.gather_no_grad(torch.cat(buffer["label"]))
        index = dist.gather_no_grad(torch.cat(buffer["index"]))
        return dist.unique_by_index(index, emb, labels)

    def _text_tower_version(self) -> tuple:
        """Changes whenever a text-tower weight does (optimizer step, checkpoint load, move)."""
        return tuple(
            (id(p), p._version, p.device)
            for name, p in self.clip.model.named_parameters()
            if not name.startswith("visual.")
        )

    def _precision_context(self) -> AbstractContextManager:
        """The trainer's autocast (``bf16-mixed``: bf16 matmuls), as in its validation steps."""
        trainer = self._trainer
        return nullcontext() if trainer is None else trainer.precision_plugin.forward_context()

    def zero_shot_classifier(self, classnames, templates) -> torch.Tensor:
        """(C, E) zero-shot class embeddings, encoded once while the text tower is unchanged.

        Prompt encoding (C x templates texts, 80 x 1000 for ImageNet) runs under the
        trainer's mixed precision, like the validation steps; the unit vectors come out in
        float32. With a locked text tower it runs once per run, otherwise once per validation.
        """
        key = (tuple(classnames), tuple(templates))
        version = self._text_tower_version()
        cached = self._zero_shot_cache.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        with self._precision_context():
            classifier = self.clip.class_embeddings(classnames, templates)
        self._zero_shot_cache[key] = (version, classifier)
        return classifier

    def evaluation_metrics(self, stage: str) -> dict[str, float]:
        """Retrieval (i2t, t2i) and zero-shot metrics of every evaluation set."""
        datasets = [loader.dataset for loader in self._eval_loaders(stage)]
        retrieval: dict[str, dict[str, int]] = defaultdict(dict)
        metrics: dict[str, float] = {}
        for idx, dataset in enumerate(datasets):
            role = getattr(dataset, "eval_role", None)
            name = getattr(dataset, "eval_name", f"set{idx}")
            if idx not in self._eval_buffers:
                continue
            if role in (RETRIEVAL_IMAGES, RETRIEVAL_TEXTS):
                retrieval[name][role] = idx
            elif role == ZERO_SHOT:
                emb, labels = self._collected(idx)
                classifier = self.zero_shot_classifier(dataset.classnames, dataset.templates)
                scores = full_precision_similarity(emb, classifier.to(emb.device))
                for key, value in zero_shot_accuracy(scores, labels).items():
                    metrics[f"{stage}/{name}/zs_{key}"] = value
                metrics.update(self.online_knn(emb, labels, f"{stage}/{name}/"))
            else:
                raise ValueError(
                    f"evaluation dataset {idx} ({type(dataset).__name__}) has no eval_role; "
                    f"expected one of {RETRIEVAL_IMAGES}, {RETRIEVAL_TEXTS}, {ZERO_SHOT}"
                )
        for name, roles in retrieval.items():
            if set(roles) != {RETRIEVAL_IMAGES, RETRIEVAL_TEXTS}:
                raise ValueError(f"retrieval set {name!r} needs both an image and a text loader")
            images, image_groups = self._collected(roles[RETRIEVAL_IMAGES])
            texts, text_groups = self._collected(roles[RETRIEVAL_TEXTS])
            # Every rank holds the same gathered sets: each scores its share of the blocks.
            for direction, out in retrieval_metrics(
                images, texts, image_groups, text_groups, process_group_shard()
            ).items():
                for key, value in out.items():
                    metrics[f"{stage}/{name}/{direction}_{key}"] = value
        return metrics

    def _log_evaluation(self, stage: str) -> None:
        if self.trainer.sanity_checking:
            self._eval_buffers = {}
            return
        metrics = self.evaluation_metrics(stage)
        # Every rank holds the same gathered data, hence the same values.
        for key, value in metrics.items():
            self.log(key, value, sync_dist=False, add_dataloader_idx=False)
        self._eval_buffers = {}

    def on_validation_epoch_end(self) -> None:
        self._log_evaluation("val")

    def on_test_epoch_end(self) -> None:
        self._log_evaluation("test")

    # ---------------------------------------------------------------- export
    def export_open_clip(self, path: str) -> None:
        """Save the fine-tuned towers as a plain open_clip state dict.

        A learnt InfoNCE scale is written into ``logit_scale`` so open_clip's
        own zero-shot tools see the trained temperature.
        """
        state = {k: v.detach().cpu() for k, v in self.clip.model.state_dict().items()}
        param = getattr(self.loss_fn, "log_logit_scale", None)
        if isinstance(param, nn.Parameter):
            state["logit_scale"] = param.detach().cpu().reshape(state["logit_scale"].shape)
        torch.save(state, path)


def retrieval_metrics(
    images: torch.Tensor,
    texts: torch.Tensor,
    image_groups: torch.Tensor,
    text_groups: torch.Tensor,
    shard: Shard | None = None,
) -> dict[str, dict[str, float]]:
    """Image→text and text→image metrics with caption groups as relevance.

    Args:
        images: (I, E) unit-norm image embeddings; ``image_groups`` (I,).
        texts: (T, E) unit-norm caption embeddings; ``text_groups`` (T,).
        shard: processes holding the same sets split the engine's blocks
            (``rl_gap.metrics.functional.sharding``); the values are one process's.

    Returns:
        ``{"i2t": {...}, "t2i": {...}}``, each with ``LOGGED_RETRIEVAL_KEYS``
        (gAP, mAP, R@1/5/10, R@P90) from the metric engine.
    """
    out = {}
    for direction, (q, d, ql, dl) in {
        "i2t": (images, texts, image_groups, text_groups),
        "t2i": (texts, images, text_groups, image_groups),
    }.items():
        result = evaluate_embeddings(q, d, ql, dl, ks=RECALL_KS, ceiling=False, shard=shard)
        out[direction] = {k: float(result[k]) for k in LOGGED_RETRIEVAL_KEYS if k in result}
    return out
