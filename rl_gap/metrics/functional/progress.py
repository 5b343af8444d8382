"""Block progress of the engine, for a caller that shows it (``rl-gap evaluate``).

The engine's passes run deep inside ``evaluate_embeddings`` (the main problem, the
threshold protocol's halves, the R@k problem over every item); rather than thread a
callback through every signature, a caller installs one for a ``with`` block and
each counting pass reports ``callback(done, total)`` blocks, starting at ``done = 0``.
Nothing is reported without a callback, and the metrics never depend on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["block_progress", "report_blocks"]

ProgressCallback = Callable[[int, int], None]
_CALLBACK: ContextVar[ProgressCallback | None] = ContextVar("engine_block_progress", default=None)


@contextmanager
def block_progress(callback: ProgressCallback | None) -> Iterator[None]:
    """Within the block, every engine counting pass calls ``callback(done, total)``."""
    token = _CALLBACK.set(callback)
    try:
        yield
    finally:
        _CALLBACK.reset(token)


def report_blocks(done: int, total: int) -> None:
    """Tell the installed callback (if any) that ``done`` of ``total`` blocks are counted."""
    callback = _CALLBACK.get()
    if callback is not None:
        callback(done, total)
