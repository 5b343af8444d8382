"""Name -> loss class registry.

A loss registers itself with ``@register_loss("name")``; nothing else needs
editing. ``build_loss(name, **kwargs)`` instantiates it, and ``loss_from_config`` builds
one from a recipe's ``loss:`` section: ``name`` picks the loss, a table per loss
(``gsap: {temperature: 0.001}``) holds that loss's own hyperparameters, so
swapping ``name`` alone swaps the loss *and* its hyperparameters (the new
loss's table, else its defaults — never another loss's values); flat keys
(command-line overrides) apply to the chosen loss and win.

A loss states its own call contract where it is defined: its ``forward(sim,
rel, valid=None, *, sharded=False)`` ranks in full precision (``@full_precision``
from :mod:`rl_gap.precision`: float32 or float64 with autocast off, even inside a
``bf16-mixed`` step) and, when it can be sharded, hands ``sharded=True`` to
:func:`rl_gap.losses.sharding.call.sharded_forward`, which runs the class's own
``forward_sharded`` (docs/losses.md, "Add a loss"). Registration only gives a
``forward`` that does not declare the precision contract that wrapper.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from torch import nn

from rl_gap.precision import full_precision

_LOSSES: dict[str, type[nn.Module]] = {}

T = TypeVar("T", bound=type[nn.Module])


def register_loss(name: str) -> Callable[[T], T]:
    """Class decorator adding a loss to the registry under ``name`` (lower case).

    A ``forward`` not decorated with ``full_precision`` is wrapped by it here
    (autocast off, half-precision ``sim`` widened to float32), so any
    registered loss ranks in full precision; the built-in losses decorate
    their own ``forward``, which is left as written.
    """
    key = name.lower()

    def decorator(cls: T) -> T:
        if key in _LOSSES and _LOSSES[key] is not cls:
            raise ValueError(f"loss name {key!r} is already registered by {_LOSSES[key].__name__}")
        if not getattr(cls.forward, "__rl_gap_full_precision__", False):
            cls.forward = full_precision(cls.forward)  # type: ignore[method-assign]
        _LOSSES[key] = cls
        return cls

    return decorator


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


def _init_defaults(cls: type) -> dict[str, Any]:
    params = inspect.signature(cls.__init__).parameters
    return {
        k: p.default
        for k, p in params.items()
        if k != "self" and p.default is not inspect.Parameter.empty
    }


def _plain_section(config: Mapping[str, Any] | None) -> dict[str, Any]:
    if config is None:
        return {}
    if hasattr(config, "as_dict"):  # a jsonargparse Namespace
        config = config.as_dict()
    if not isinstance(config, Mapping):
        raise ValueError(
            f"the loss section must be a mapping like {{name: gsap, gsap: {{...}}}}, got {config!r}"
        )
    return {str(k): (v.as_dict() if hasattr(v, "as_dict") else v) for k, v in config.items()}


def split_loss_section(
    config: Mapping[str, Any] | None, default: str = "gsap"
) -> tuple[str, dict[str, dict[str, Any]], dict[str, Any]]:
    """``(name, per-loss tables, flat keys)`` of a recipe's ``loss:`` section, validated.

    The section is ``{name: <loss>, <loss>: {<its keywords>}, ..., <keyword>: <value>}``:
    a key named after a registered loss is that loss's table (its own
    hyperparameters, e.g. the values the paper or ``rl-gap tune`` gives it), any
    other key is a value for the chosen loss itself (a command-line override).

    Raises:
        ValueError: naming an unknown loss, a table that is not a mapping, a table
            key its loss does not take, or a flat key the chosen loss does not take.
    """
    section = _plain_section(config)
    name = str(section.pop("name", default)).lower()
    cls = get_loss_class(name)
    tables: dict[str, dict[str, Any]] = {}
    flat: dict[str, Any] = {}
    for key, value in section.items():
        if key.lower() in _LOSSES:
            if value is None:
                value = {}
            if hasattr(value, "as_dict"):
                value = value.as_dict()
            if not isinstance(value, Mapping):
                raise ValueError(
                    f"loss table {key!r} must be a mapping of {key}'s keywords "
                    f"({sorted(_init_params(_LOSSES[key.lower()]))}), got {value!r}"
                )
            table_cls = _LOSSES[key.lower()]
            unknown = sorted(set(map(str, value)) - _init_params(table_cls))
            if unknown:
                raise ValueError(
                    f"loss table {key!r} has unknown key(s) {unknown}; "
                    f"{key} takes {sorted(_init_params(table_cls))}"
                )
            tables[key.lower()] = dict(value)
        else:
            flat[key] = value
    own = _init_params(cls)
    bad = sorted(set(flat) - own)
    if bad:
        elsewhere = sorted(k for k in bad if any(k in _init_params(c) for c in _LOSSES.values()))
        hint = (
            f"; {elsewhere} belong to other losses: a key outside a per-loss table applies "
            f"to the chosen loss, so put another loss's values in its own table "
            f"(e.g. loss.<that loss>.{elsewhere[0]})"
            if elsewhere
            else f"; per-loss tables are named after registered losses ({', '.join(available_losses())})"
        )
        raise ValueError(f"loss {name!r} does not take {bad} (it takes {sorted(own)}){hint}")
    return name, tables, flat


def resolve_loss_config(config: Mapping[str, Any] | None, default: str = "gsap") -> dict[str, Any]:
    """``{"name": name, **keywords}`` the chosen loss is built with.

    Precedence: the loss's own defaults < its table ``loss.<name>`` < flat keys
    (command-line overrides). Another loss's table is never used, so
    ``--model.loss.name msap`` on a gSAP recipe trains mSAP with mSAP's values.
    """
    name, tables, flat = split_loss_section(config, default)
    return {"name": name, **tables.get(name, {}), **flat}


def normalize_loss_section(
    config: Mapping[str, Any] | None, default: str = "gsap", expand: bool = False
) -> dict[str, Any]:
    """The section with flat keys moved into the chosen loss's table (every table kept).

    ``expand=True`` also fills the chosen table with every keyword the loss is
    built with (its defaults included): the block ``--print_config`` shows.
    """
    name, tables, flat = split_loss_section(config, default)
    chosen = {**tables.get(name, {}), **flat}
    if expand:
        chosen = {**_init_defaults(get_loss_class(name)), **chosen}
    return {"name": name, **{k: v for k, v in tables.items() if k != name}, name: chosen}


def loss_from_config(config: Mapping[str, Any] | None, default: str = "gsap") -> nn.Module:
    """Build a loss from a recipe's ``loss:`` section (see :func:`resolve_loss_config`).

    ``{name: msap, gsap: {temperature: 0.001, neg_drop: 0.9}, msap: {temperature: 0.01}}``
    builds ``msap(temperature=0.01)``; ``{name: gsoftbin, num_bins: 20}`` (flat keys,
    as from the command line) builds ``gsoftbin(num_bins=20)``. A key the chosen loss
    does not take, outside another loss's table, raises ``ValueError``.
    """
    kwargs = resolve_loss_config(config, default)
    return get_loss_class(kwargs.pop("name"))(**kwargs)
