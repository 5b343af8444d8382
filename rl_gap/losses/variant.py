"""A loss variant's keywords derived from its parent's, so that the defaults live in one place.

A variant loss takes its parent's keywords, less some and plus its own: the global form
of a per-query surrogate (``gsupap`` from ``supap``, without ``symmetric``), ROADMAP on
top of SupAP (plus the calibration keywords). Written out again in every variant's
``__init__``, each default would have several copies to keep equal; :func:`variant_of`
derives the variant's signature from the parent's instead.

The derived signature is what every reader of a loss's keywords sees: ``inspect.signature``
(the registry's loss-section checks, ``--print_config``'s expanded loss block, ``rl-gap
tune``), and calling the class with a keyword outside it raises the ``TypeError`` a
written-out signature would.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T", bound=type)

_SKIPPED = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def variant_of(parent: type, *, drop: tuple[str, ...] = ()) -> Callable[[T], T]:
    """Class decorator: ``__init__`` takes ``parent``'s keywords less ``drop``, then its own.

    The ``__init__`` the class defines or inherits (a mixin's) names only its own keywords
    (keyword-only, after ``*``) and forwards ``**kwargs`` to ``super().__init__``; a class
    without one of its own inherits ``parent``'s and only drops keywords. The decorator
    replaces it by one with the combined signature that checks every call against it
    (unknown or dropped keyword, too many positional arguments: ``TypeError``) and then
    calls the original with the keywords as given (omitted ones keep their defaults).

    Args:
        parent: the class whose ``__init__`` keywords (and defaults) the variant takes.
        drop: ``parent`` keywords the variant does not take.

    Raises:
        TypeError: at class creation, for a ``drop`` name ``parent`` does not take.
    """

    def decorator(cls: T) -> T:
        init = cls.__init__
        own_signature = inspect.signature(init)
        own = list(own_signature.parameters.values())
        inherited = list(inspect.signature(parent.__init__).parameters.values())[1:]
        unknown = sorted(set(drop) - {p.name for p in inherited})
        if unknown:
            raise TypeError(f"{cls.__name__}: {parent.__name__} takes no keyword(s) {unknown}")
        names = {p.name for p in inherited}
        params = [own[0]] + [p for p in inherited if p.kind not in _SKIPPED and p.name not in drop]
        params += [p for p in own[1:] if p.kind not in _SKIPPED and p.name not in names]
        signature = inspect.Signature(params, return_annotation=own_signature.return_annotation)

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            given = signature.bind(self, *args, **kwargs).arguments
            init(self, **{k: v for k, v in given.items() if k != params[0].name})

        __init__.__signature__ = signature  # type: ignore[attr-defined]
        __init__.__qualname__ = f"{cls.__qualname__}.__init__"
        cls.__init__ = __init__  # type: ignore[misc]
        return cls

    return decorator
