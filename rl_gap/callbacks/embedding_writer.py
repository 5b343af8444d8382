"""Embedding export: ``rl-gap predict`` writes ``.npy`` files the other commands read.

``rl-gap predict --config <recipe> --ckpt_path <ckpt>`` runs the module's
``predict_step`` over the data module's ``predict_dataloader`` and this
callback writes, per evaluation split, into ``<run>/embeddings/<split>/``
(``<run>``: the run folder holding the checkpoint, ``<run>/checkpoints/x.ckpt``,
else the predict command's own run folder):

- ``embeddings.npy`` (N, D) float32 and ``labels.npy`` (N,) int64 (metric
  learning, MoCo v3 features, CLIP zero-shot images);
- for a CLIP retrieval set: ``image_embeddings.npy`` + ``image_labels.npy``
  and ``text_embeddings.npy`` + ``text_labels.npy`` (labels = caption-group /
  pair ids, so an image and its captions share one id);
- ``<prefix>indices.npy`` (N,) int64: each row's index in the split's dataset;
- ``meta.json``: split, files and shapes, checkpoint, module, world size.

Rows are in dataset order whatever the number of processes: under DDP each
rank saves its part under ``<split>/.parts/``, then rank 0 merges the parts by
dataset index (dropping the duplicates a distributed sampler pads with) and
removes them (multi-node runs need the run folder on a shared file system).
A failure on rank 0 is raised on every rank.

Then, with no user code::

    rl-gap evaluate --queries <run>/embeddings/test/embeddings.npy \\
        --query-labels <run>/embeddings/test/labels.npy --exclude-self

A ``predict_step`` returns a dict with ``indices`` (B,), ``labels`` (B,) and
one of ``embeddings`` / ``image_embeddings`` / ``text_embeddings`` (B, D).
Split names come from the dataset's ``eval_name``, else the data module's
``predict_split_names``, else ``predict`` (``predict_<i>`` for several loaders).
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, ModelCheckpoint

__all__ = ["EmbeddingWriter", "EMBEDDING_KEYS", "merge_parts"]

# predict_step key -> file prefix of the embeddings and of their labels/indices
EMBEDDING_KEYS = {"embeddings": "", "image_embeddings": "image_", "text_embeddings": "text_"}


def _check_prediction(prediction: Any) -> str:
    if not isinstance(prediction, dict):
        raise TypeError(
            f"EmbeddingWriter needs predict_step to return a dict, got {type(prediction).__name__}"
        )
    keys = [k for k in EMBEDDING_KEYS if k in prediction]
    missing = {"labels", "indices"} - set(prediction)
    if len(keys) != 1 or missing:
        raise KeyError(
            f"predict_step must return 'labels', 'indices' and exactly one of "
            f"{list(EMBEDDING_KEYS)}; got keys {sorted(prediction)}"
        )
    return keys[0]


def merge_parts(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenate the ranks' parts of one split and kind; sort by dataset index, drop repeats.

    Args:
        parts: one dict per rank with ``embeddings`` (n_r, D), ``labels`` (n_r,) and
            ``indices`` (n_r,).

    Returns:
        the same keys over the whole split, rows in increasing dataset index, each
        index once (a distributed sampler repeats samples to even out the ranks).
    """
    parts = [p for p in parts if len(p["indices"])]
    if not parts:
        raise ValueError("no predictions to write (empty predict loader?)")
    indices = np.concatenate([p["indices"] for p in parts])
    order = np.argsort(indices, kind="stable")
    keep = order[np.r_[True, np.diff(indices[order]) != 0]]
    return {
        k: np.concatenate([p[k] for p in parts])[keep] for k in ("embeddings", "labels", "indices")
    }


class EmbeddingWriter(BasePredictionWriter):
    """Writes each predict loader's embeddings, labels and indices as ``.npy`` files.

    Args:
        output_dir: folder of the split folders; default ``<run>/embeddings`` where ``<run>``
            holds the checkpoint's ``checkpoints/`` folder, else ``trainer.default_root_dir``.
    """

    def __init__(self, output_dir: str | None = None) -> None:
        super().__init__(write_interval="batch")
        self.output_dir = output_dir
        self._buffers: dict[tuple[int, str], dict[str, list[np.ndarray]]] = {}

    def setup(self, trainer, pl_module, stage: str) -> None:
        """Predict saves no checkpoint: the trainer's ``ModelCheckpoint`` callbacks are
        dropped before the checkpoint is restored. Restored, they would load the state
        of the fit's folder into this command's run folder and warn that "the dirpath has
        changed" on every ``rl-gap predict --ckpt_path``."""
        if stage == "predict":
            trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, ModelCheckpoint)]

    # ----------------------------------------------------------- collection
    def on_predict_epoch_start(self, trainer, pl_module) -> None:
        self._buffers = {}
        if trainer.world_size > 1:  # parts of an interrupted run must not be merged in
            if trainer.global_rank == 0:
                for folder in self._root(trainer).glob("*/.parts"):
                    shutil.rmtree(folder, ignore_errors=True)
            trainer.strategy.barrier("embedding_writer_start")

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx=0
    ) -> None:
        kind = _check_prediction(prediction)
        embeddings = torch.as_tensor(prediction[kind]).detach()
        if embeddings.ndim != 2:
            raise ValueError(f"{kind} must be (B, D), got shape {tuple(embeddings.shape)}")
        labels = torch.as_tensor(prediction["labels"]).detach().reshape(-1)
        indices = torch.as_tensor(prediction["indices"]).detach().reshape(-1)
        if labels.is_floating_point():
            raise TypeError(f"labels must be integers, got {labels.dtype}")
        if not len(labels) == len(indices) == len(embeddings):
            raise ValueError(
                f"{kind} {tuple(embeddings.shape)}, labels {tuple(labels.shape)} and indices "
                f"{tuple(indices.shape)} disagree on the batch size"
            )
        buffer = self._buffers.setdefault((dataloader_idx, kind), defaultdict(list))
        buffer["embeddings"].append(embeddings.float().cpu().numpy())
        buffer["labels"].append(labels.to(torch.int64).cpu().numpy())
        buffer["indices"].append(indices.to(torch.int64).cpu().numpy())

    # --------------------------------------------------------------- output
    def _root(self, trainer) -> Path:
        if self.output_dir:
            return Path(self.output_dir)
        ckpt = Path(str(trainer.ckpt_path)) if trainer.ckpt_path else None
        if ckpt is not None and ckpt.parent.name == "checkpoints":
            return ckpt.parent.parent / "embeddings"  # the run that trained the checkpoint
        return Path(trainer.default_root_dir) / "embeddings"

    @staticmethod
    def split_name(trainer, dataloader_idx: int) -> str:
        """``eval_name`` of the loader's dataset, else the data module's ``predict_split_names``."""
        loaders = trainer.predict_dataloaders
        loaders = list(loaders) if isinstance(loaders, list | tuple) else [loaders]
        dataset = getattr(loaders[dataloader_idx], "dataset", None)
        name = getattr(dataset, "eval_name", None)
        names = getattr(trainer.datamodule, "predict_split_names", None)
        if name is None and names is not None and dataloader_idx < len(names):
            name = names[dataloader_idx]
        if name is None:
            name = "predict" if len(loaders) == 1 else f"predict_{dataloader_idx}"
        return str(name)

    def on_predict_epoch_end(self, trainer, pl_module) -> None:
        root = self._root(trainer)
        world, rank = trainer.world_size, trainer.global_rank
        outputs = {}  # (split, kind) -> this rank's arrays
        for (idx, kind), buffer in sorted(self._buffers.items()):
            part = {k: np.concatenate(v) for k, v in buffer.items()}
            outputs[(self.split_name(trainer, idx), kind)] = part
        if world > 1:
            # Every rank may hold any (split, kind), possibly none: rank 0 reads what exists.
            for (split, kind), part in outputs.items():
                folder = root / split / ".parts"
                folder.mkdir(parents=True, exist_ok=True)
                np.savez(folder / f"{kind}_rank{rank}.npz", **part)
            trainer.strategy.barrier("embedding_writer_parts")
        error = None
        if rank == 0:
            try:
                written = self._merge_and_write(trainer, root, outputs, world)
                print(f"rl-gap embeddings: {', '.join(str(p) for p in written)}")
            except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
                error = f"{type(exc).__name__}: {exc}"
        if world > 1:
            error = trainer.strategy.broadcast(error, src=0)
        self._buffers = {}
        if error is not None:
            raise RuntimeError(f"embedding export failed on rank 0: {error}")

    def _merge_and_write(self, trainer, root: Path, outputs, world: int) -> list[Path]:
        keys = set(outputs)
        if world > 1:
            for folder in root.glob("*/.parts"):
                for file in folder.glob("*_rank*.npz"):
                    keys.add((folder.parent.name, file.name.rsplit("_rank", 1)[0]))
        splits: dict[str, dict[str, Any]] = defaultdict(dict)
        for split, kind in sorted(keys):
            if world > 1:
                files = sorted((root / split / ".parts").glob(f"{kind}_rank*.npz"))
                parts = [dict(np.load(f)) for f in files]
            else:
                parts = [outputs[(split, kind)]]
            merged = merge_parts(parts)
            prefix = EMBEDDING_KEYS[kind]
            folder = root / split
            folder.mkdir(parents=True, exist_ok=True)
            np.save(folder / f"{prefix}embeddings.npy", merged["embeddings"].astype(np.float32))
            np.save(folder / f"{prefix}labels.npy", merged["labels"].astype(np.int64))
            np.save(folder / f"{prefix}indices.npy", merged["indices"].astype(np.int64))
            norms = np.linalg.norm(merged["embeddings"], axis=1)
            splits[split][f"{prefix}embeddings"] = {
                "file": f"{prefix}embeddings.npy",
                "labels": f"{prefix}labels.npy",
                "indices": f"{prefix}indices.npy",
                "shape": list(merged["embeddings"].shape),
                "unit_norm": bool(np.allclose(norms, 1.0, atol=1e-3)),
            }
        written = []
        for split, files in splits.items():
            shutil.rmtree(root / split / ".parts", ignore_errors=True)
            meta = {
                "split": split,
                "arrays": files,
                "checkpoint": str(trainer.ckpt_path) if trainer.ckpt_path else None,
                "module": type(trainer.lightning_module).__name__,
                "world_size": world,
                "dtype": "float32",
                "label_dtype": "int64",
            }
            (root / split / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
            written.append(root / split)
        return written
