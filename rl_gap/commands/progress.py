"""Progress of the long commands (``evaluate``, ``knn``, ``linear-probe``, ``tune``).

The same library as the trainer's bar (rich), drawn on **stderr**, so a JSON or
CSV result on stdout stays machine-readable; ``--quiet`` turns it off. Off a
terminal (a log file, CI) rich draws the bar once when it stops.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["add_quiet_argument", "progress", "Bar", "StepLog"]


def add_quiet_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quiet", action="store_true", help="no progress bar (it is drawn on stderr)"
    )


class Bar:
    """The current task of a rich ``Progress`` (or nothing when quiet): ``start`` a
    phase, ``advance`` or ``set`` its count."""

    def __init__(self, progress: Any | None) -> None:
        self._progress = progress
        self._task: Any = None

    def start(self, description: str, total: int | None) -> None:
        """A new phase: a line of its own under ``description``, counting from 0 (the
        finished phases stay, so the bar drawn off a terminal lists every phase)."""
        if self._progress is not None:
            self._task = self._progress.add_task(description, total=total)

    def advance(self, steps: int = 1) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, steps)

    def set(self, done: int, total: int | None = None) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=done, total=total)


@contextmanager
def progress(quiet: bool = False) -> Iterator[Bar]:
    """A progress bar on stderr for the duration of the block (a no-op when ``quiet``)."""
    if quiet:
        yield Bar(None)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(),
    )  # fmt: skip
    with Progress(*columns, console=Console(stderr=True)) as bar:
        yield Bar(bar)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


class StepLog:
    """Progress of units that run their own trainer (``tune``'s trials and seeds).

    Each run inside draws the trainer's rich bar, and rich allows one live display at
    a time, so this writes one line per finished unit to stderr instead:
    ``[tune] gsap search: 3/10 done, 1m05s elapsed, ~2m10s left``. The estimate uses
    the units done by this process (a resumed command skips finished ones).
    """

    def __init__(
        self, command: str, name: str, total: int, done: int = 0, quiet: bool = False
    ) -> None:
        self.command, self.name, self.total, self.done = command, name, total, done
        self.quiet = quiet
        self._first = done
        self._start = time.perf_counter()

    def step(self, detail: str = "") -> None:
        self.done += 1
        if self.quiet:
            return
        elapsed = time.perf_counter() - self._start
        ran = self.done - self._first
        left = max(self.total - self.done, 0)
        eta = f", ~{_duration(elapsed / ran * left)} left" if ran and left else ""
        extra = f" ({detail})" if detail else ""
        print(
            f"[{self.command}] {self.name}: {self.done}/{self.total} done{extra}, "
            f"{_duration(elapsed)} elapsed{eta}",
            file=sys.stderr,
            flush=True,
        )
