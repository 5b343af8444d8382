"""Name -> loss class registry.

A loss registers itself with ``@register_loss("name")``; nothing else needs
editing. ``build_loss(name, **kwargs)`` instantiates it, and
``loss_from_config({"name": ..., **kwargs})`` builds one from a recipe's flat
``loss:`` section, so swapping ``name`` alone swaps the loss.

Registration also gives a loss the precision contract of
:mod:`rl_gap.precision`: its ``forward`` is wrapped by
:func:`~rl_gap.precision.full_precision`, so it ranks float32 (or float64)
similarities with autocast off even when called inside a ``bf16-mixed`` step,
and the keyword ``sharded=True``: ``loss_fn(sim_rows, rel_rows, valid_rows,
sharded=True)`` runs the loss on this rank's rows of a matrix sharded over a
process group (``rl_gap.losses.sharding.dispatch``; docs/definitions.md).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from torch import nn

from rl_gap.precision import full_precision

_LOSSES: dict[str, type[nn.Module]] = {}

T = TypeVar("T", bound=type[nn.Module])


def register_loss(name: str) -> Callable[[T], T]:
    """Class decorator adding a loss to the registry under ``name`` (lower case).

    The class's ``forward`` is wrapped in place by ``full_precision`` (autocast
    off, half-precision ``sim`` widened to float32), whatever kernel it calls.
    """
    key = name.lower()

    def decorator(cls: T) -> T:
        if key in _LOSSES and _LOSSES[key] is not cls:
            raise ValueError(f"loss name {key!r} is already registered by {_LOSSES[key].__name__}")
        cls.forward = _with_sharded(full_precision(cls.forward))  # type: ignore[method-assign]
        _LOSSES[key] = cls
        return cls

    return decorator


# The sharded implementations (``rl_gap.losses.sharding``) import the loss modules, which
# import this registry; the package face installs them here, so no import runs back.
_SHARDED: dict[str, Callable[..., Any]] = {}


def install_sharded_forward(fn: Callable[..., Any]) -> None:
    """Route ``loss_fn(..., sharded=True)`` of every registered loss to ``fn(module, sim, rel, valid)``."""
    _SHARDED["forward"] = fn


def _with_sharded(forward: Callable[..., Any]) -> Callable[..., Any]:
    """Add the ``sharded=`` keyword to a loss ``forward`` (idempotent)."""
    if getattr(forward, "__rl_gap_sharded__", False):
        return forward

    @functools.wraps(forward)
    def wrapper(self, sim, rel, valid=None, *, sharded: bool = False):
        if sharded:
            return full_precision(_SHARDED["forward"])(self, sim, rel, valid)
        return forward(self, sim, rel, valid)

    wrapper.__rl_gap_sharded__ = True  # type: ignore[attr-defined]
    wrapper.__rl_gap_full_precision__ = True  # type: ignore[attr-defined]  (both paths are)
    return wrapper


def available_losses() -> list[str]:
    """Sorted names of every registered loss."""
    return sorted(_LOSSES)


def get_loss_class(name: str) -> type[nn.Module]:
    key = str(name).lower()
    if key not in _LOSSES:
        raise ValueError(f"unknown loss {name!r}; known losses: {', '.join(available_losses())}")
    return _LOSSES[key]


def build_loss(name: str, **kwargs: Any) -> nn.Module:
    """Instantiate the registered loss ``name`` with ``kwargs``.

    Example:
        One batch of two queries, a positive on the diagonal. Query 1's
        negative (0.95) outranks its positive (0.8). gSAP ranks the four pairs
        as one list (0.95-, 0.9+, 0.8+, 0.1-), so at a small temperature its
        loss is 1 - (1/2 + 2/3)/2; mSAP averages the per-query APs 1 and 1/2,
        so its loss is 1 - 3/4:

        >>> import torch
        >>> from rl_gap.losses import build_loss
        >>> sim = torch.tensor([[0.9, 0.1], [0.95, 0.8]])
        >>> rel = torch.eye(2, dtype=torch.bool)
        >>> build_loss("gsap", temperature=0.001)(sim, rel)
        tensor(0.4167)
        >>> build_loss("msap", temperature=0.001)(sim, rel)
        tensor(0.2500)
        >>> build_loss("no_such_loss")
        Traceback (most recent call last):
            ...
        ValueError: unknown loss 'no_such_loss'...
    """
    return get_loss_class(name)(**kwargs)


def _init_params(cls: type) -> set[str]:
    params = inspect.signature(cls.__init__).parameters
    return {p for p in params if p != "self"}


def loss_from_config(config: Mapping[str, Any] | None, default: str = "gsap") -> nn.Module:
    """Build a loss from a flat recipe section ``{name: gsap, temperature: ..., ...}``.

    Keys that the chosen loss does not take but another registered loss does
    (``neg_drop`` after ``--model.loss.name infonce``) are ignored with a
    warning, so one override swaps the loss. A key no registered loss takes is
    a typo and raises ``ValueError``.
    """
    config = dict(config or {})
    name = config.pop("name", default)
    cls = get_loss_class(name)
    own = _init_params(cls)
    known_anywhere = set().union(*(_init_params(c) for c in _LOSSES.values()))
    unknown = sorted(set(config) - known_anywhere)
    if unknown:
        raise ValueError(
            f"loss config has unknown key(s) {unknown}; {name!r} accepts {sorted(own)}"
        )
    ignored = sorted(set(config) - own)
    if ignored:
        warnings.warn(
            f"loss {name!r} does not take {ignored}; ignoring them", UserWarning, stacklevel=2
        )
    return cls(**{k: v for k, v in config.items() if k in own})
