"""A fake CUDA device for CPU-only tests: tensors that compute on the CPU but report ``cuda:0``.

rl_gap's CUDA paths are its torch paths, so most GPU bugs are device bugs: a tensor created
without ``device=`` (it lands on the CPU) meeting a CUDA tensor, a CPU generator driving a CUDA
sampler, ``.numpy()`` on a CUDA tensor, state left on the wrong device. This module makes those
raise on a machine without a GPU, as they would on one.

- :class:`FakeCudaTensor`, a ``torch.Tensor`` subclass whose ``.device`` is ``cuda:0`` and
  ``.is_cuda`` is True; its storage is an ordinary CPU tensor.
- :class:`FakeCudaMode`, a ``TorchFunctionMode`` that, for every torch call:

  * turns ``device="cuda"`` (factories, ``.to``, ``.cuda()``, ``*_like``, ``new_*``) into a CPU
    call whose result is a :class:`FakeCudaTensor`; ``.cpu()`` / ``.to("cpu")`` return plain
    CPU tensors (copies, as a real device transfer would);
  * propagates the fake device: any result of an op on a fake-CUDA tensor is fake-CUDA;
  * raises ``RuntimeError`` when one op mixes a fake-CUDA tensor with a CPU tensor of
    dimension >= 1 (0-d CPU tensors are allowed, as CUDA allows CPU scalars; CPU index tensors
    in ``x[idx]`` are allowed, as CUDA moves them; ``copy_`` copies across devices);
  * raises ``TypeError`` on ``.numpy()`` of a fake-CUDA tensor (``.item()``/``.tolist()``
    synchronise and work, as on a GPU);
  * checks that a ``generator=`` lives on the device of the tensors it draws
    (``torch.Generator(device="cuda")`` is a :class:`FakeCudaGenerator` under the fixture);
  * under ``torch.use_deterministic_algorithms(True)``, raises on the ops CUDA has no
    deterministic kernel for (weighted ``bincount``, ``histc``, accumulating ``put_``,
    ``median`` with indices).

Gradients computed by the autograd engine are plain CPU tensors internally; inside a backward
pass plain tensors therefore count as being on the fake device, and a fake-CUDA tensor's
``.grad`` reads back as fake-CUDA.

Use the ``fake_cuda`` pytest fixture (``tests/conftest.py``; on a machine with a GPU it also
runs each test on the real device, through :class:`RealCuda`): it activates the mode, replaces
``torch.Generator`` and makes ``nn.Module.to("cuda")`` swap parameters (so they report the
fake device). ``fake_cuda.available()`` additionally reports ``torch.cuda.is_available()`` as
True for code that branches on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

CUDA0 = torch.device("cuda", 0)
CPU = torch.device("cpu")
_RealGenerator = torch.Generator


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that reports ``cuda:0``; only meaningful while :class:`FakeCudaMode` runs."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return CUDA0

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    @property
    def is_cpu(self) -> bool:  # type: ignore[override]
        return False

    def get_device(self) -> int:  # type: ignore[override]
        return 0

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        with torch._C.DisableTorchFunction():
            body = torch.Tensor.__repr__(self.as_subclass(torch.Tensor))
        return body[:-1] + ", device='cuda:0')" if body.endswith(")") else body


class FakeCudaGenerator(_RealGenerator):
    """A CPU generator that reports ``cuda:0`` (what ``torch.Generator(device="cuda")`` builds)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return CUDA0


def _is_cuda_device(device: Any) -> bool | None:
    """True for a CUDA device spec, False for another one, None for no device given."""
    if device is None:
        return None
    if isinstance(device, int):
        return True  # an ordinal means a CUDA device, as in torch
    return torch.device(device).type == "cuda"


class _GeneratorFactory(_RealGenerator):
    """Stands in for ``torch.Generator``: ``device="cuda"`` builds a :class:`FakeCudaGenerator`."""

    def __new__(cls, device: Any = "cpu") -> _RealGenerator:  # type: ignore[misc]
        if _is_cuda_device(device):
            return FakeCudaGenerator()
        return _RealGenerator(device)


def is_fake(x: Any) -> bool:
    return isinstance(x, FakeCudaTensor)


def _wrap(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and not isinstance(x, FakeCudaTensor):
        if isinstance(x, torch.nn.Parameter):
            return x  # a parameter keeps its class; modules get fake ones by swapping
        if x.grad_fn is None:  # keeps a leaf a leaf (as_subclass would add an alias node)
            return torch.Tensor._make_subclass(FakeCudaTensor, x, x.requires_grad)
        return x.as_subclass(FakeCudaTensor)
    return x


def _unwrap_to_cpu(x: Any, source: torch.Tensor) -> Any:
    """A plain CPU tensor; a copy when it would still share memory with the device tensor."""
    if isinstance(x, FakeCudaTensor):
        if x.untyped_storage().data_ptr() == source.untyped_storage().data_ptr():
            x = x.clone()
        return x.as_subclass(torch.Tensor)
    return x


_AUTOGRAD_FUNCS = {torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad}
_COPY_FUNCS = {torch.Tensor.copy_}
_INDEX_FUNCS = {torch.Tensor.__getitem__}
_TO_FUNCS = {torch.Tensor.to}
_NO_MIX_CHECK = {
    torch.Tensor.__setitem__,
    torch.Tensor.type_as,
    torch._has_compatible_shallow_copy_type,
}


def _basic_index(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items)


class FakeCudaMode(TorchFunctionMode):
    """The torch-function mode behind the ``fake_cuda`` fixture (see the module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: C901
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        self_arg = args[0] if args else None
        in_backward = torch._C._current_autograd_node() is not None

        if func in _AUTOGRAD_FUNCS:
            return self._autograd(func, args, kwargs)
        if func is torch.Tensor.numpy and is_fake(self_arg):
            raise TypeError(
                "can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy "
                "the tensor to host memory first."
            )
        if func is torch.Tensor.cpu:
            out = self._call(func, args, kwargs)
            return _unwrap_to_cpu(out, self_arg)
        if func is torch.Tensor.cuda:
            out = self._call(torch.Tensor.to, (self_arg,), {})
            return out if is_fake(self_arg) else _wrap(out.clone())
        if func is torch.Tensor.pin_memory:
            return self_arg
        if func in _TO_FUNCS or func is torch.Tensor.type_as:
            return self._to(func, args, kwargs)

        # Where the result lives: an explicit device wins, else that of the inputs.
        target: bool | None = None
        if "device" in kwargs:
            target = _is_cuda_device(kwargs["device"])
            if target:
                kwargs["device"] = CPU
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        any_fake = any(map(is_fake, tensors)) or (in_backward and bool(tensors))
        if target is None:
            target = any_fake

        if (
            func not in _COPY_FUNCS
            and func not in _NO_MIX_CHECK
            and name not in ("__get__", "__set__")
        ):
            self._check_mix(func, args, kwargs, tensors, in_backward)
        if func is torch.Tensor.__setitem__ and is_fake(self_arg) and len(args) == 3:
            value = args[2]
            if (
                isinstance(value, torch.Tensor)
                and not is_fake(value)
                and value.dim() > 0
                and not _basic_index(args[1])
            ):
                self._raise_mix(func)
        self._check_generator(kwargs.get("generator"), target)
        if target and torch.are_deterministic_algorithms_enabled():
            self._check_deterministic(func, args, kwargs)

        out = self._call(func, args, kwargs)
        if func is torch.Tensor.copy_ or func is torch.Tensor.__setitem__:
            return out
        if not target:
            return out
        inputs = {id(t) for t in tensors}
        return tree_map(lambda o: o if id(o) in inputs else _wrap(o), out)

    def _autograd(self, func, args, kwargs):
        """Run backward with this mode active, so that backward formulas see the fake device.

        The handler runs with the mode popped, and the autograd engine would inherit that; so
        the mode is pushed again and autograd's own torch-function dispatch (which would land
        back here) is bypassed for the call.
        """
        if func is torch.Tensor.backward:
            names = ("gradient", "retain_graph", "create_graph", "inputs")
            bound = dict(zip(names, args[1:], strict=False)) | kwargs
            func, args, kwargs = (
                torch.autograd.backward,
                (args[0],),
                {
                    "grad_tensors": bound.get("gradient"),
                    "retain_graph": bound.get("retain_graph"),
                    "create_graph": bound.get("create_graph", False),
                    "inputs": bound.get("inputs"),
                },
            )
        with self, mock.patch.object(torch.autograd, "has_torch_function", lambda *_: False):
            return func(*args, **kwargs)

    @staticmethod
    def _call(func, args, kwargs):
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    def _to(self, func, args, kwargs):
        src = args[0]
        if func is torch.Tensor.type_as:
            other = args[1]
            out = self._call(func, args, kwargs)
            return self._place(out, src, is_fake(other))
        device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
        if len(args) > 1 and isinstance(args[1], torch.Tensor):
            device, dtype = (CUDA0 if is_fake(args[1]) else CPU), args[1].dtype
        want = _is_cuda_device(device)
        call_kwargs: dict[str, Any] = {"non_blocking": non_blocking}
        if dtype is not None:
            call_kwargs["dtype"] = dtype
        if memory_format is not None:
            call_kwargs["memory_format"] = memory_format
        out = self._call(torch.Tensor.to, (src,), call_kwargs)
        if want is None:
            want = is_fake(src)
        return self._place(out, src, want)

    @staticmethod
    def _place(out: torch.Tensor, src: torch.Tensor, want_fake: bool) -> torch.Tensor:
        if want_fake:
            if is_fake(src) or out is not src:
                return out if is_fake(out) else _wrap(out)
            return _wrap(out.clone())  # a real host-to-device copy
        return _unwrap_to_cpu(out, src) if is_fake(src) else out

    def _check_mix(self, func, args, kwargs, tensors, in_backward) -> None:
        if in_backward or not any(map(is_fake, tensors)):
            return
        candidates = tensors
        if func in _INDEX_FUNCS:
            candidates = [args[0]]  # CUDA moves CPU index tensors to the device
        for t in candidates:
            if not is_fake(t) and t.dim() > 0:
                self._raise_mix(func)

    @staticmethod
    def _raise_mix(func) -> None:
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least two devices, "
            f"cuda:0 and cpu! (fake CUDA device, in {getattr(func, '__qualname__', func)})"
        )

    @staticmethod
    def _check_deterministic(func, args, kwargs) -> None:
        """Raise where CUDA has only a nondeterministic kernel (torch.use_deterministic_algorithms)."""
        if func in (torch.bincount, torch.Tensor.bincount):
            weighted = kwargs.get("weights") is not None or len(args) > 1
            op = "_bincount_cuda" if weighted else None
        elif func in (torch.histc, torch.Tensor.histc):
            op = "_histc_cuda"
        elif func is torch.Tensor.put_:
            op = "put_" if kwargs.get("accumulate", len(args) > 3 and args[3]) else None
        elif func in (torch.median, torch.Tensor.median, torch.nanmedian, torch.Tensor.nanmedian):
            op = "median CUDA with indices output" if len(args) > 1 or "dim" in kwargs else None
        else:
            op = None
        if op is not None:
            raise RuntimeError(
                f"{op} does not have a deterministic implementation, but you set "
                "'torch.use_deterministic_algorithms(True)' (fake CUDA device)"
            )

    @staticmethod
    def _check_generator(generator: Any, target: bool | None) -> None:
        if generator is None:
            return
        gen_cuda = isinstance(generator, FakeCudaGenerator)
        if bool(target) != gen_cuda:
            want, got = ("cuda", "cpu") if target else ("cpu", "cuda")
            raise RuntimeError(
                f"Expected a '{want}' device type for generator but found '{got}' (fake CUDA)"
            )


class FakeCuda:
    """Handle the ``fake_cuda`` fixture yields: the device, tensor helpers, availability."""

    device = CUDA0

    def tensor(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` copied onto the fake device (keeps ``requires_grad``)."""
        return x.to("cuda")

    @staticmethod
    def is_fake(x: Any) -> bool:
        return is_fake(x)

    @contextmanager
    def available(self) -> Iterator[None]:
        """Report ``torch.cuda.is_available()`` True (one device) inside the block."""
        with (
            mock.patch.object(torch.cuda, "is_available", lambda: True),
            mock.patch.object(torch.cuda, "device_count", lambda: 1),
        ):
            yield


class RealCuda:
    """The same handle for the real ``cuda:0`` (what the fixture yields on a GPU machine)."""

    device = CUDA0

    def tensor(self, x: torch.Tensor) -> torch.Tensor:
        return x.to("cuda")

    @staticmethod
    def is_fake(x: Any) -> bool:
        return False

    @contextmanager
    def available(self) -> Iterator[None]:
        yield


@contextmanager
def fake_cuda_session() -> Iterator[FakeCuda]:
    """Activate the fake CUDA device (what the ``fake_cuda`` fixture wraps)."""
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        with mock.patch.object(torch, "Generator", _GeneratorFactory), FakeCudaMode():
            yield FakeCuda()
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
