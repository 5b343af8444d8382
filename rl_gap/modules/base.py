"""The plumbing every training module shares.

A subclass supplies the encoders and one method, ``global_similarity(batch)``,
returning the (sim, rel, valid) matrices of the *global* batch (use
``self.gather`` / ``self.gather_labels``); the base class owns the loss (the
recipe's ``loss:`` section, read by :func:`rl_gap.losses.registry.read_loss_section`),
the optimizer and schedule (one :class:`rl_gap.optim.OptimizerSettings`), and logging
of the loss's learnable parameters.

Sharded loss (``shard_loss``, docs/distributed.md): with more than one rank,
a subclass that implements ``local_similarity(batch)`` (the (sim, rel, valid)
of this rank's consecutive block of rows of the global matrix against the
gathered batch's columns) has the loss computed sharded
(``loss_fn(..., sharded=True)``): each rank scores B/W rows instead of all B,
and the update still equals one process holding the global batch.

Micro-batches (``micro_batch_size``, docs/distributed.md): a subclass that implements
``batch_rows(batch)`` and ``encode_rows(batch, rows)`` (and ``frozen_rows`` for
embeddings without gradient) gets its embeddings from :meth:`step_embeddings`, which
with ``micro_batch_size`` set encodes the batch in micro-batches with gradient caching
(``rl_gap.modules.grad_cache``): one loss on the whole global batch, the same update,
activations of one micro-batch at a time.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from typing import Any

import lightning as L
import torch

from rl_gap import dist
from rl_gap import dist as shard_comm
from rl_gap.losses.registry import read_loss_section
from rl_gap.losses.sharding import supports_sharding, warn_replicated
from rl_gap.modules.compile_settings import COMPILE_OPTIONS, compile_settings_error  # noqa: F401
from rl_gap.modules.grad_cache import cached_encode
from rl_gap.modules.split_batch import (
    batchnorm_micro_batch_error,
    check_split_batch,
    warn_batchnorm,
)
from rl_gap.optim import OPTIMIZER_DEFAULTS as DEFAULTS
from rl_gap.optim import OptimizerSettings

SHARD_LOSS_MODES = ("auto", "true", "false")


def check_shard_loss(value: str | bool) -> str:
    """Normalise ``shard_loss`` (``auto``/``true``/``false`` or a bool) to its string form."""
    if isinstance(value, bool):
        return "true" if value else "false"
    mode = str(value).lower()
    if mode not in SHARD_LOSS_MODES:
        raise ValueError(f"shard_loss must be one of {SHARD_LOSS_MODES} (or a bool), got {value!r}")
    return mode


def enable_grad_checkpointing(model: torch.nn.Module, name: str) -> None:
    """timm's ``set_grad_checkpointing(True)``; a clear error for a model without it."""
    unsupported = f"grad_checkpointing: backbone {name!r} does not support gradient checkpointing"
    setter = getattr(model, "set_grad_checkpointing", None)
    if not callable(setter):
        raise ValueError(unsupported)
    try:
        setter(True)
    except (AssertionError, NotImplementedError) as err:  # timm models that declare no support
        raise ValueError(unsupported) from err


def compile_in_place(
    modules: Iterable[torch.nn.Module | None], settings: bool | Mapping[str, Any] | None = True
) -> None:
    """``torch.compile`` each module in place (``Module.compile``: state-dict keys unchanged).

    ``settings``: a module's ``compile`` argument. False/None: nothing; True: torch's
    defaults (inductor); a mapping: ``torch.compile`` keywords among ``COMPILE_OPTIONS``,
    e.g. ``{backend: cudagraphs}`` or ``{mode: max-autotune, dynamic: false}``.
    """
    if settings is None or settings is False:
        return
    problem = compile_settings_error(settings)
    if problem:
        raise ValueError(f"compile: {problem}")
    kwargs = {} if settings is True else dict(settings)
    mode = kwargs.get("mode")
    if mode is not None:
        from torch._inductor import list_mode_options

        modes = list(list_mode_options())
        if mode not in modes:
            raise ValueError(f"compile: unknown mode {mode!r}; torch has {modes}")
    backend = kwargs.get("backend")
    if isinstance(backend, str):
        from torch import _dynamo

        known = _dynamo.list_backends(exclude_tags=())
        if backend not in known:
            raise ValueError(f"compile: unknown backend {backend!r}; torch has {known}")
    for module in modules:
        if isinstance(module, torch.nn.Module):
            module.compile(**kwargs)


class RankingModule(L.LightningModule, abc.ABC):
    """Base LightningModule: registry loss on the global batch + optimizer/scheduler.

    The optimizer and schedule keywords are kept as one
    :class:`~rl_gap.optim.OptimizerSettings` (``self.optimizer_settings``), checked
    once here; a subclass declares its own defaults for some of them (CLIP's
    ``lr=1e-5``) and passes the rest on as ``**kwargs``.

    Args:
        loss: the recipe's loss section, e.g. ``{"name": "gsap", "gsap": {"temperature":
            0.01}}`` (:func:`rl_gap.losses.registry.read_loss_section`); None: the default
            loss; ``--model.loss.name msap`` swaps the loss.
        optimizer: a registered optimizer name (``adamw``, ``sgd``, ``lars``).
        lr: peak learning rate.
        weight_decay: applied to ≥2-D parameters only.
        betas: AdamW betas.
        momentum: SGD/LARS momentum.
        scheduler: ``cosine`` (linear warmup then cosine), ``constant`` or ``none``.
        warmup: warmup length in optimizer steps, or a fraction of all steps if < 1.
        min_lr_ratio: final LR of the cosine as a fraction of ``lr``.
        lr_scales: parameter-name prefix -> LR multiplier (e.g. a slower backbone).
        shard_loss: ``auto`` (shard the loss over ranks when there are several and the
            loss supports it, else the replicated loss with one warning), ``true``
            (shard; an error if the loss cannot be sharded) or ``false`` (every rank
            computes the loss on the whole global matrix).
        micro_batch_size: encode each rank's batch in micro-batches of this many samples
            with gradient caching: the loss and update of the whole batch, the activation
            memory of a micro-batch, about one extra forward pass of time. None = off.
            With BatchNorm the statistics are per micro-batch (a warning says so).
        allow_split_batch: accept trainer settings that hand the loss a part of the batch
            (``accumulate_grad_batches > 1``): a different objective, refused by default.
    """

    def __init__(
        self,
        loss: dict[str, Any] | None = None,
        optimizer: str = DEFAULTS.optimizer,
        lr: float = DEFAULTS.lr,
        weight_decay: float = DEFAULTS.weight_decay,
        betas: tuple[float, float] = DEFAULTS.betas,
        momentum: float = DEFAULTS.momentum,
        scheduler: str = DEFAULTS.scheduler,
        warmup: float = DEFAULTS.warmup,
        min_lr_ratio: float = DEFAULTS.min_lr_ratio,
        lr_scales: dict[str, float] | None = DEFAULTS.lr_scales,
        shard_loss: str | bool = "auto",
        micro_batch_size: int | None = None,
        allow_split_batch: bool = False,
    ) -> None:
        super().__init__()
        self.shard_loss = check_shard_loss(shard_loss)
        if micro_batch_size is not None and (
            isinstance(micro_batch_size, bool) or int(micro_batch_size) != micro_batch_size
            or micro_batch_size < 1
        ):  # fmt: skip
            raise ValueError(
                f"micro_batch_size must be a positive integer or None, got {micro_batch_size!r}"
            )
        self.micro_batch_size = None if micro_batch_size is None else int(micro_batch_size)
        self.allow_split_batch = bool(allow_split_batch)
        # Before anything is built: `--model.lr nan` fails here, naming the setting.
        self.optimizer_settings = OptimizerSettings(
            optimizer, lr, weight_decay, betas, momentum, scheduler, warmup, min_lr_ratio, lr_scales
        )
        self.loss_section = read_loss_section(loss)
        self.loss_fn = self.loss_section.build()
        self._warned_replicated = False
        if self.shard_loss == "true":
            reason = supports_sharding(self.loss_fn)
            if reason is not None:
                raise ValueError(f"shard_loss=true: {reason}")

    @property
    def loss_config(self) -> dict[str, Any]:
        """The loss section this module was built from, flat keys moved into their table."""
        return self.loss_section.as_recipe()

    # ----------------------------------------------------------- global batch
    @staticmethod
    def gather(x: torch.Tensor) -> torch.Tensor:
        """All-gather with gradients (identity on one process)."""
        return dist.gather_with_grad(x)

    @staticmethod
    def gather_labels(x: torch.Tensor) -> torch.Tensor:
        return dist.gather_no_grad(x)

    @staticmethod
    def local_rows(n_local: int, device: torch.device) -> slice:
        """This rank's rows of the gathered global batch (``slice(0, n)`` on one process)."""
        return dist.local_slice(n_local, device)

    @abc.abstractmethod
    def global_similarity(
        self, batch: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Return (sim, rel, valid) over the global batch. Subclasses implement."""

    # ----------------------------------------------------------- micro-batches
    def batch_rows(self, batch: Any) -> int:
        """Samples in this rank's batch (subclasses that support ``micro_batch_size``)."""
        raise NotImplementedError(f"{type(self).__name__} does not support micro_batch_size")

    def encode_rows(self, batch: Any, rows: slice) -> tuple[torch.Tensor, ...]:
        """The differentiable embeddings of ``rows`` of the batch, one tensor per tower or view."""
        raise NotImplementedError(f"{type(self).__name__} does not support micro_batch_size")

    def frozen_rows(self, batch: Any, rows: slice) -> tuple[torch.Tensor, ...]:
        """Embeddings of ``rows`` computed without gradient (MoCo's keys); none by default."""
        return ()

    def step_embeddings(
        self, batch: Any
    ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """``(encode_rows, frozen_rows)`` of the whole batch; micro-batched when configured.

        Micro-batching applies when ``micro_batch_size`` is below this rank's batch and
        autograd is on (training); otherwise the batch is encoded in one pass.
        """
        n = self.batch_rows(batch)
        everything = slice(0, n)
        params = [
            p
            for n_, p in self.named_parameters()
            if p.requires_grad and not n_.startswith("loss_fn.")
        ]
        size = self.micro_batch_size
        if size is None or size >= n or not torch.is_grad_enabled() or not params:
            return self.encode_rows(batch, everything), self.frozen_rows(batch, everything)
        return cached_encode(
            lambda rows: self.encode_rows(batch, rows), n, size, params, self,
            frozen=lambda rows: self.frozen_rows(batch, rows),
        )  # fmt: skip

    def setup(self, stage: str) -> None:
        """Refuse trainer settings that split the batch the loss sees; warn about BatchNorm."""
        if stage != "fit":
            return
        if self._trainer is not None:
            check_split_batch(self._trainer, self.allow_split_batch)
        if self.micro_batch_size is not None:
            problem = batchnorm_micro_batch_error(self, self.micro_batch_size)
            if problem:
                raise ValueError(problem)
            warn_batchnorm(self)

    # ----------------------------------------------------------- sharded loss
    def shards_loss(self) -> bool:
        """Whether this step computes the loss sharded over ranks (see ``shard_loss``)."""
        if self.shard_loss == "false" or dist.world_size() == 1:
            return False
        if not callable(getattr(self, "local_similarity", None)):
            reason = f"{type(self).__name__} has no local_similarity(batch)"
        else:
            reason = supports_sharding(self.loss_fn)
        if reason is None:
            return True
        if self.shard_loss == "true":
            raise ValueError(f"shard_loss=true: {reason}")
        if not self._warned_replicated:
            self._warned_replicated = True
            warn_replicated(reason)
        return False

    def sharded_loss(
        self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor | None
    ) -> torch.Tensor:
        """The global loss from this rank's rows, with gradients scaled for DDP.

        The sharded backward gives each rank the single-process gradient of its
        own samples (rows directly, columns through ``gather``'s summing
        backward), so each rank's encoder gradient is its share and the shares
        *sum* to the single-process gradient; the loss parameters' shares sum
        likewise. DDP *averages* over ranks, hence a factor W on the gradient:
        on the loss output when the loss has learnable parameters (InfoNCE and
        SigLIP are linear in the upstream gradient), else on ``sim`` (BlackBox's
        gradient is not linear in the upstream gradient, so it must see the same
        upstream value as on one process).
        """
        world = dist.world_size()
        if any(p.requires_grad for p in self.loss_fn.parameters()):
            return shard_comm.scale_grad(self.loss_fn(sim, rel, valid, sharded=True), world)
        return self.loss_fn(shard_comm.scale_grad(sim, world), rel, valid, sharded=True)

    # ---------------------------------------------------------------- training
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.shards_loss():
            sim, rel, valid = self.local_similarity(batch)
            loss = self.sharded_loss(sim, rel, valid)
        else:
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
        optimizer = self.optimizer_settings.optimizer_for(self.optimizer_modules())
        total = int(self.trainer.estimated_stepping_batches) if self._trainer else 1
        scheduler = self.optimizer_settings.scheduler_for(optimizer, total)
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
