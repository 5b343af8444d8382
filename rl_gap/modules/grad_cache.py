"""Gradient caching (Gao et al., 2021): the global batch's embeddings on a fraction of the memory.

A ranking loss over a batch of B samples couples every sample with every other, so the
batch cannot be split the way a per-sample loss can (Lightning's gradient accumulation
would rank B/k lists instead of one list of B). Gradient caching keeps the objective:

1. embed the batch micro-batch by micro-batch *without* autograd (activations of one
   micro-batch alive at a time), saving each micro-batch's RNG state;
2. compute the loss once on the whole (B, d) embedding matrix, with autograd from the
   embeddings on (gathered, sharded, learnable loss parameters: all as usual);
3. in backward, re-run each micro-batch with autograd under its saved RNG state (the
   same dropout masks) and the same autocast, and back-propagate its rows of the
   embedding gradient into the parameters.

The parameters get the sum of the micro-batches' gradients, which is the full-batch
gradient for any encoder whose rows do not interact (LayerNorm, dropout, no BatchNorm).
All of it is one autograd node (:class:`_Replay`) whose inputs are the parameters: each
parameter's gradient arrives once per backward, so DDP's reducer hooks fire once and
optimizer steps, gradient clipping and checkpoints behave as for a plain step.

Pure torch: no Lightning import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

Encode = Callable[[slice], tuple[torch.Tensor, ...]]


def micro_batches(n: int, size: int, no_single: bool = False) -> list[slice]:
    """Consecutive row slices of at most ``size`` covering ``range(n)``.

    ``no_single``: a one-row remainder joins the micro-batch before it (``size + 1`` rows),
    for encoders with BatchNorm, which cannot normalise a batch of one sample in training.
    """
    if size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {size}")
    chunks = [slice(start, min(start + size, n)) for start in range(0, n, size)]
    if no_single and len(chunks) > 1 and chunks[-1].stop - chunks[-1].start == 1:
        chunks[-2:] = [slice(chunks[-2].start, n)]
    return chunks


def has_training_batchnorm(module: nn.Module) -> bool:
    """Whether ``module`` holds a BatchNorm layer in training mode (batch statistics)."""
    return any(isinstance(m, _BatchNorm) and m.training for m in module.modules())


class _RngState:
    """The CPU generator and the CUDA generators of ``devices``: saved, restorable."""

    def __init__(self, devices: Sequence[int]) -> None:
        self.devices = list(devices)
        self.cpu = torch.get_rng_state()
        self.cuda = [torch.cuda.get_rng_state(d) for d in self.devices]

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        for device, state in zip(self.devices, self.cuda):
            torch.cuda.set_rng_state(state, device)


class _AutocastState:
    """The autocast in force when the embeddings were first computed (replayed in backward)."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.enabled = torch.is_autocast_enabled(device_type)
        self.dtype = torch.get_autocast_dtype(device_type)

    def context(self):
        if not self.enabled:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


class CachedEncoding:
    """One step's micro-batched encoding: the no-grad pass and the replay of each micro-batch.

    Args:
        encode: rows -> the differentiable embeddings of those rows (a tuple of (n_rows, ...)
            tensors: one per tower or view).
        frozen: rows -> embeddings computed without gradient (MoCo's momentum keys), once per
            micro-batch in the first pass and never replayed; ``None`` if there are none.
        n: the number of rows of this step (this rank's batch).
        micro_batch_size: rows per micro-batch.
        params: the parameters ``encode`` depends on that require gradients.
        owner: the module whose buffers the replay must leave as the first pass left them
            (BatchNorm running statistics are updated once per step, not twice).
    """

    def __init__(
        self,
        encode: Encode,
        frozen: Encode | None,
        n: int,
        micro_batch_size: int,
        params: Sequence[nn.Parameter],
        owner: nn.Module,
    ) -> None:
        self.encode = encode
        self.frozen_fn = frozen
        self.chunks = micro_batches(n, micro_batch_size, no_single=has_training_batchnorm(owner))
        self.params = list(params)
        self.owner = owner
        device = self.params[0].device
        self.cuda_devices = [device.index or 0] if device.type == "cuda" else []
        self.autocast = _AutocastState(device.type)
        self.rng: list[_RngState] = []
        self.frozen: tuple[torch.Tensor, ...] = ()
        self._buffers: list[tuple[torch.Tensor, torch.Tensor]] = []

    def first_pass(self) -> tuple[torch.Tensor, ...]:
        """Every micro-batch without autograd: the concatenated embeddings (and frozen ones)."""
        parts, frozen = [], []
        with torch.no_grad():
            for rows in self.chunks:
                self.rng.append(_RngState(self.cuda_devices))
                parts.append(tuple(self.encode(rows)))
                if self.frozen_fn is not None:
                    frozen.append(tuple(self.frozen_fn(rows)))
        self.frozen = tuple(torch.cat(columns) for columns in zip(*frozen))
        self._buffers = [(b, b.detach().clone()) for b in self.owner.buffers()]
        return tuple(torch.cat(columns) for columns in zip(*parts))

    def replay(self, grads: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
        """Each micro-batch again with autograd; the parameters' summed gradients."""
        totals: list[torch.Tensor | None] = [None] * len(self.params)
        with torch.random.fork_rng(devices=self.cuda_devices):
            for rows, rng in zip(self.chunks, self.rng):
                rng.restore()
                with torch.enable_grad(), self.autocast.context():
                    outputs = self.encode(rows)
                pairs = [(o, g[rows]) for o, g in zip(outputs, grads) if o.requires_grad]
                if not pairs:
                    continue
                got = torch.autograd.grad(
                    [o for o, _ in pairs],
                    self.params,
                    [g.to(o.dtype) for o, g in pairs],
                    allow_unused=True,
                )
                for i, g in enumerate(got):
                    if g is not None:
                        totals[i] = g if totals[i] is None else totals[i] + g
        with torch.no_grad():
            for buffer, saved in self._buffers:
                buffer.copy_(saved)
        return totals


class _Replay(torch.autograd.Function):
    """Forward: the no-grad micro-batched embeddings; backward: the replay's parameter gradients."""

    @staticmethod
    def forward(ctx, plan: CachedEncoding, *params: torch.Tensor):  # type: ignore[override]
        ctx.plan = plan
        return plan.first_pass()

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):  # type: ignore[override]
        plan = ctx.plan
        ctx.plan = None  # one backward per step; free the saved states
        return (None, *plan.replay(grads))


def cached_encode(
    encode: Encode,
    n: int,
    micro_batch_size: int,
    params: Sequence[nn.Parameter],
    owner: nn.Module,
    frozen: Encode | None = None,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """``(encode(all rows), frozen(all rows))`` computed micro-batch by micro-batch.

    The first tuple carries gradients to ``params`` through a replay of each micro-batch
    in backward (see the module docstring); the second has no gradient. Gradients equal
    those of ``encode(slice(0, n))`` with the micro-batches' dropout masks.
    """
    plan = CachedEncoding(encode, frozen, n, micro_batch_size, params, owner)
    embeddings = _Replay.apply(plan, *plan.params)
    return tuple(embeddings), plan.frozen
