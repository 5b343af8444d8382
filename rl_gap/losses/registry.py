"""Name -> loss class registry.

A loss registers itself with ``@register_loss("name")``; nothing else needs
editing. ``build_loss(name, **kwargs)`` instantiates it, and :func:`read_loss_section`
reads a recipe's ``loss:`` section, the one place that does (the training parser, the
run's modules and ``rl-gap tune`` all call it; ``loss_from_config`` builds what it reads):
``name`` picks the loss, a table per loss
(``gsap: {temperature: 0.001}``) holds that loss's own hyperparameters, so
swapping ``name`` alone swaps the loss *and* its hyperparameters (the new
loss's table, else its defaults — never another loss's values); flat keys
(command-line overrides) apply to the chosen loss and win.

A loss states its own call contract where it is defined: the built-in losses derive from
:class:`rl_gap.losses.base.RankingLoss`, whose one template ``forward(sim, rel, valid=None,
*, sharded=False)`` ranks in full precision (``@full_precision`` from
:mod:`rl_gap.precision`: float32 or float64 with autocast off, even inside a ``bf16-mixed``
step), checks the inputs, and hands ``sharded=True`` to the class's own ``_loss_sharded``
(docs/losses.md, "Add a loss"). Registration never edits a class: a loss whose ``forward``
does not declare the precision contract is registered as a subclass that adds it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import nn

from rl_gap.precision import full_precision

_LOSSES: dict[str, type[nn.Module]] = {}

T = TypeVar("T", bound=type[nn.Module])


def register_loss(name: str) -> Callable[[T], T]:
    """Class decorator adding a loss to the registry under ``name`` (lower case).

    The decorated class is returned unchanged. When its ``forward`` is not decorated with
    ``full_precision`` (a loss written outside the package), the registry holds a subclass of
    the same name whose ``forward`` is (autocast off, half-precision ``sim`` widened to
    float32), so any registered loss ranks in full precision; ``RankingLoss`` subclasses
    declare it already and are registered as written.
    """
    key = name.lower()

    def decorator(cls: T) -> T:
        held = _LOSSES.get(key)
        if held is not None and held is not cls and _declared_by(held) is not cls:
            raise ValueError(f"loss name {key!r} is already registered by {held.__name__}")
        _LOSSES[key] = cls if _full_precision(cls) else _with_full_precision(cls)
        return cls

    return decorator


def _full_precision(cls: type) -> bool:
    return bool(getattr(cls.forward, "__rl_gap_full_precision__", False))


def _with_full_precision(cls: T) -> T:
    """A subclass of ``cls`` (same name and module) whose ``forward`` ranks in full precision."""
    namespace = {
        "forward": full_precision(cls.forward),
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        "__rl_gap_declared_by__": cls,
    }
    return type(cls.__name__, (cls,), namespace)  # type: ignore[return-value]


def _declared_by(held: type) -> type:
    """The class a registered entry was declared as (itself, or what it subclasses)."""
    return held.__dict__.get("__rl_gap_declared_by__", held)


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


# ------------------------------------------------------------ a recipe's loss section
DEFAULT_LOSS_NAME = "gsap"
"""The loss a recipe gets when its ``loss:`` section names none."""


class LossSectionError(ValueError):
    """A ``loss:`` section that cannot be built; the message is one line naming the key."""


@dataclass(frozen=True)
class LossSection:
    """A recipe's ``loss:`` section as :func:`read_loss_section` read and checked it.

    Attributes:
        name: the chosen loss (lower case).
        tables: every per-loss table as written (``{"gsap": {"temperature": 0.001}}``).
        flat: keys written outside a table (command-line overrides): the chosen loss's.
    """

    name: str
    tables: dict[str, dict[str, Any]]
    flat: dict[str, Any]

    @property
    def kwargs(self) -> dict[str, Any]:
        """The keywords the chosen loss is built with: its table, then the flat keys (which win)."""
        return {**self.tables.get(self.name, {}), **self.flat}

    def build(self) -> nn.Module:
        """The chosen loss; its own value checks (``temperature: 0``) raise :class:`LossSectionError`."""
        try:
            return get_loss_class(self.name)(**self.kwargs)
        except ValueError as err:
            raise LossSectionError(str(err)) from err

    def as_recipe(self, expand: bool = False) -> dict[str, Any]:
        """The section with the flat keys moved into the chosen loss's table (every table kept).

        ``expand=True`` also fills the chosen table with every keyword the loss is built
        with, its defaults included: the block ``--print_config`` shows.
        """
        chosen = self.kwargs
        if expand:
            chosen = {**_init_defaults(get_loss_class(self.name)), **chosen}
        others = {k: v for k, v in self.tables.items() if k != self.name}
        return {"name": self.name, **others, self.name: chosen}


def read_loss_section(
    section: Mapping[str, Any] | None,
    default: str = DEFAULT_LOSS_NAME,
    recipes: Iterable[tuple[str, Any]] = (),
) -> LossSection:
    """Read a recipe's ``loss:`` section: the loss it chooses and the keywords it is built with.

    The section is ``{name: <loss>, <loss>: {<its keywords>}, ..., <keyword>: <value>}``:
    a key named after a registered loss is that loss's table (its own hyperparameters,
    e.g. the values the paper or ``rl-gap tune`` gives it), any other key is a value for
    the chosen loss itself (a command-line override). Swapping ``name`` therefore swaps the
    hyperparameters too: the new loss's table, else its defaults, never another loss's.

    Args:
        section: the merged section (a mapping or a jsonargparse Namespace); None: ``default``.
        default: the loss chosen when the section names none.
        recipes: ``(file, that file's own loss section)`` of the recipe files ``section`` was
            merged from: a file's keys outside a table belong to that file's loss, so they
            are refused when the merged section chooses another one.

    Raises:
        LossSectionError: one line naming an unknown loss, a table that is not a mapping, a
            table key its loss does not take, a flat key the chosen loss does not take, or a
            recipe's flat keys that would reach a swapped-in loss. Values are checked by
            :meth:`LossSection.build` (the loss's own checks).
    """
    name, tables, flat = _split(_plain_section(section), default)
    known = available_losses()
    if name not in known:
        raise LossSectionError(f"unknown loss {name!r}; known losses: {', '.join(known)}")
    for table_name, table in tables.items():
        takes = sorted(_init_params(get_loss_class(table_name)))
        if not isinstance(table, Mapping):
            raise LossSectionError(
                f"loss table {table_name!r} must be a mapping of {table_name}'s keywords "
                f"({takes}), got {table!r}"
            )
        unknown = sorted(set(map(str, table)) - set(takes))
        if unknown:
            raise LossSectionError(
                f"loss table {table_name!r} has unknown key(s) {unknown}; {table_name} takes {takes}"
            )
    _check_flat_keys(name, flat)
    for path, own in recipes:
        _check_recipe_keys(path, own, name, default)
    return LossSection(name, {k: dict(v) for k, v in tables.items()}, flat)


def _split(section: dict[str, Any], default: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``(name, per-loss tables, flat keys)``, unchecked."""
    section = dict(section)
    name = str(section.pop("name", default)).lower()
    known = set(available_losses())
    tables: dict[str, Any] = {}
    flat: dict[str, Any] = {}
    for key, value in section.items():
        if key.lower() in known:
            tables[key.lower()] = {} if value is None else value
        else:
            flat[key] = value
    return name, tables, flat


def _check_flat_keys(name: str, flat: Mapping[str, Any]) -> None:
    own = _init_params(get_loss_class(name))
    bad = sorted(set(flat) - own)
    if not bad:
        return
    elsewhere = sorted(
        k for k in bad if any(k in _init_params(get_loss_class(n)) for n in available_losses())
    )
    hint = (
        f"; {elsewhere} belong to other losses: a key outside a per-loss table applies "
        f"to the chosen loss, so put another loss's values in its own table "
        f"(e.g. loss.<that loss>.{elsewhere[0]})"
        if elsewhere
        else f"; per-loss tables are named after registered losses ({', '.join(available_losses())})"
    )
    raise LossSectionError(f"loss {name!r} does not take {bad} (it takes {sorted(own)}){hint}")


def _check_recipe_keys(path: str, own: Any, chosen: str, default: str) -> None:
    """A recipe file's flat keys would be applied to ``chosen``, another loss than the file's."""
    try:
        name, _, flat = _split(_plain_section(own), default)
    except ValueError:
        return  # not a mapping: the merged section reports it
    if not flat or name == chosen:
        return
    moved = ", ".join(f"loss.{name}.{k}" for k in sorted(flat))
    raise LossSectionError(
        f"{path} sets {sorted(flat)} for {name!r} outside a per-loss table, and the loss "
        f"is now {chosen!r}: they would be applied to {chosen!r}. A loss's "
        f"hyperparameters belong to that loss: write them as {moved} (and "
        f"{chosen}'s own under loss.{chosen}, else its defaults are used)"
    )


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
        raise LossSectionError(
            f"the loss section must be a mapping like {{name: gsap, gsap: {{...}}}}, got {config!r}"
        )
    return {str(k): (v.as_dict() if hasattr(v, "as_dict") else v) for k, v in config.items()}


def loss_from_config(
    config: Mapping[str, Any] | None, default: str = DEFAULT_LOSS_NAME
) -> nn.Module:
    """Build a loss from a recipe's ``loss:`` section (see :func:`read_loss_section`).

    ``{name: msap, gsap: {temperature: 0.001, neg_drop: 0.9}, msap: {temperature: 0.01}}``
    builds ``msap(temperature=0.01)``; ``{name: gsoftbin, num_bins: 20}`` (flat keys,
    as from the command line) builds ``gsoftbin(num_bins=20)``. A key the chosen loss
    does not take, outside another loss's table, raises :class:`LossSectionError`.
    """
    return read_loss_section(config, default).build()
