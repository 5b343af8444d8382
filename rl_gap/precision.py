"""Float32 ranking whatever the trainer precision: the one mechanism every loss, module and
metric uses.

Under ``bf16-mixed`` autocast a bf16 cosine near 1 is resolved only to 2^-8 ≈ 4e-3, coarser
than the temperatures ranked (τ ≤ 1e-2) and coarse enough to tie and reorder similarities an
exact metric must keep apart. So every similarity that is ranked, by a loss or a metric, is
formed and ranked in float32 (float64 kept) with autocast off:

- :func:`full_precision` decorates a loss ``forward`` or kernel (``register_loss`` applies it
  to every registered loss, ``rl_gap/losses/registry.py``);
- :func:`full_precision_normalize` / :func:`full_precision_similarity` are how encoders,
  modules and metrics form unit embeddings and ``a @ bᵀ``;
- :func:`autocast_disabled` is the context underneath, for code that scores in blocks;
- :func:`ieee_float32`, which ``autocast_disabled`` enters too: float32 GEMMs in IEEE float32
  whatever ``torch.set_float32_matmul_precision`` / ``allow_tf32`` say globally.

Why the last one: Lightning advises A100/H100 users to call
``torch.set_float32_matmul_precision("high"|"medium")``; float32 GEMMs then run as TF32 (10-bit
mantissa, ~1e-3 relative) or bf16 passes (also on CPUs with bf16 matmul units), coarser than
the temperatures ranked, and exact ties change. The global setting still applies to the
encoder; only the ranked similarities (and the losses' and metrics' own GEMMs) are kept exact.

Pure torch: no Lightning import.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar

import torch

FnT = TypeVar("FnT", bound=Callable[..., Any])
HALF_DTYPES = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16/bfloat16 -> float32 (accumulations over large batches); float64 stays."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def widen(x: Any) -> Any:
    """A float16/bfloat16 tensor cast (differentiably) to float32; anything else unchanged."""
    if isinstance(x, torch.Tensor) and x.dtype in HALF_DTYPES:
        return x.float()
    return x


def _device_type(item: Any) -> str | None:
    if isinstance(item, torch.Tensor):
        return item.device.type
    if isinstance(item, (torch.device, str)):
        return torch.device(item).type
    return None


_MATMUL_BACKENDS = ("cuda", "mkldnn")


def _matmul_backends() -> list[Any]:
    return [getattr(torch.backends, name).matmul for name in _MATMUL_BACKENDS]


@contextmanager
def ieee_float32() -> Iterator[None]:
    """Run float32 matmuls in full IEEE float32 (no TF32, no bf16 passes) inside the block.

    Sets ``torch.set_float32_matmul_precision("highest")`` (which also clears
    ``torch.backends.cuda.matmul.allow_tf32``) and restores the previous global setting on
    exit, in whichever API it was made (the legacy one, or the per-backend
    ``torch.backends.*.matmul.fp32_precision``). Re-entrant; a no-op when already "highest".
    Float64 GEMMs and convolutions (``cudnn.allow_tf32``) are not affected.
    """
    try:
        legacy: str | None = torch.get_float32_matmul_precision()
    except RuntimeError:  # legacy and per-backend APIs were mixed: no single legacy value
        legacy = None
    if legacy == "highest":
        yield
        return
    per_backend = [b.fp32_precision for b in _matmul_backends()]
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        if legacy is not None:
            torch.set_float32_matmul_precision(legacy)
        for backend, value in zip(_matmul_backends(), per_backend, strict=True):
            if backend.fp32_precision != value:  # set per backend, not by the legacy call
                backend.fp32_precision = value


@contextmanager
def autocast_disabled(*items: Any) -> Iterator[None]:
    """Switch autocast off on the CPU and on the device of every tensor/device in ``items``.

    Other items are ignored. Only device types where autocast is on are touched, so it is a
    no-op (and warning-free) outside mixed precision, and device types without autocast
    (``meta``) are skipped. Float32 matmuls inside run in IEEE float32 (:func:`ieee_float32`).
    """
    device_types = {"cpu"} | {t for t in map(_device_type, items) if t is not None}
    with ExitStack() as stack:
        stack.enter_context(ieee_float32())
        for device_type in sorted(device_types):
            available = torch.amp.is_autocast_available(device_type)
            if available and torch.is_autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type=device_type, enabled=False))
        yield


def full_precision(fn: FnT) -> FnT:
    """Decorate a loss ``forward``/kernel so that it never computes in half precision.

    The wrapped call runs with autocast off (:func:`autocast_disabled`) and with every
    float16/bfloat16 tensor argument widened to float32 (float32/float64 and bool/integer
    tensors pass unchanged). The cast is an autograd op, so gradients flow back to a
    half-precision input in its own dtype. Works on plain functions, methods and
    ``autograd.Function`` forward/backward alike; decorating twice is harmless.
    """
    if getattr(fn, "__rl_gap_full_precision__", False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with autocast_disabled(*args, *kwargs.values()):
            args = tuple(widen(a) for a in args)
            kwargs = {k: widen(v) for k, v in kwargs.items()}
            return fn(*args, **kwargs)

    wrapper.__rl_gap_full_precision__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def full_precision_normalize(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """L2-normalise ``x`` along ``dim`` in float32 (float64 kept), autocast off.

    Embeddings leave an encoder this way, so a unit vector's self-similarity is 1 to float32
    precision (a bf16 one is only within ~4e-3 of 1).
    """
    with autocast_disabled(x):
        return torch.nn.functional.normalize(widen(x), dim=dim)


def full_precision_similarity(
    queries: torch.Tensor, keys: torch.Tensor | None = None
) -> torch.Tensor:
    """``queries @ keys.T`` in float32 (float64 kept), autocast off.

    Args:
        queries: (Q, E) floating embeddings (any precision).
        keys: (D, E) floating embeddings; None = ``queries`` (a batch against itself).

    Returns:
        (Q, D) similarities in ``float32``, or ``float64`` when either input is.
    """
    keys = queries if keys is None else keys
    if queries.dim() != 2 or keys.dim() != 2 or queries.shape[1] != keys.shape[1]:
        raise ValueError(
            f"similarity needs (Q, E) and (D, E) embeddings, got {tuple(queries.shape)} "
            f"and {tuple(keys.shape)}"
        )
    dtype = torch.promote_types(compute_dtype(queries.dtype), compute_dtype(keys.dtype))
    with autocast_disabled(queries, keys):
        return _IEEESimilarity.apply(queries.to(dtype), keys.to(dtype))


class _IEEESimilarity(torch.autograd.Function):
    """``q @ kᵀ`` whose backward GEMMs (the gradient into the encoder) are IEEE float32 too.

    Autograd runs a plain matmul's backward outside any context the forward entered, under
    the global precision; this one re-enters :func:`ieee_float32` there.
    """

    @staticmethod
    def forward(ctx, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(queries, keys)
        return queries @ keys.T

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        queries, keys = ctx.saved_tensors
        grad_q = grad_k = None
        with autocast_disabled(grad):
            if ctx.needs_input_grad[0]:
                grad_q = grad @ keys
            if ctx.needs_input_grad[1]:
                grad_k = grad.T @ queries
        return grad_q, grad_k
