"""``rl-gap ... --help`` lines the help record does not hold, printed from their last output.

The record (:mod:`rl_gap.help_spec`) replays ``rl-gap <command> --help``; any other help line
(a recipe or option before ``--help``) is kept here as the text it printed.

Building LightningCLI's help imports torch, Lightning (which imports
torchmetrics, torchvision and ``torch._dynamo``) and every module class: many
seconds for a page of text. The first ``--help`` of a command line runs as
usual and stores what it printed; later ones print the stored text. The key
covers everything the text depends on: the command line, the terminal width,
the Python and library versions, and the size and modification time of every
``rl_gap`` source file and of any file named on the command line (a recipe),
so an edit or an upgrade rebuilds it.

The pages live in ``<cache>/help`` where ``<cache>`` is rl_gap's one cache folder
(``$RL_GAP_CACHE``, else ``$XDG_CACHE_HOME/rl_gap`` or ``~/.cache/rl_gap``, as for the built
native helpers); ``RL_GAP_HELP_CACHE=0`` turns them off, with the replay of the record.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from rl_gap import native_build

HELP_FLAGS = ("-h", "--help")
LIBRARIES = ("lightning", "jsonargparse", "torch", "timm", "open_clip_torch", "torchmetrics")


def cache_dir() -> Path:
    """``<rl_gap's cache folder>/help``."""
    return native_build.cache_dir() / "help"


def enabled() -> bool:
    """Pages (and the record's replay) are on unless ``RL_GAP_HELP_CACHE=0``."""
    return os.environ.get("RL_GAP_HELP_CACHE") != "0"


def _library_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"


def _named_files(words: list[str]) -> list[Path]:
    files = []
    for word in words:
        for text in (word, word.partition("=")[2]):
            if text and os.path.isfile(text):
                files.append(Path(text))
    return files


def help_key(words: list[str]) -> str:
    """Hash of everything the help text of ``words`` depends on."""
    digest = hashlib.sha256()
    digest.update(json.dumps([words, sys.version, sys.executable]).encode())
    digest.update(str(shutil.get_terminal_size().columns).encode())
    digest.update(" ".join(_library_version(name) for name in LIBRARIES).encode())
    package = Path(__file__).resolve().parents[1]  # rl_gap/
    for path in [*sorted(package.rglob("*.py")), *_named_files(words)]:
        stat = path.stat()
        digest.update(f"{path.resolve()}:{stat.st_mtime_ns}:{stat.st_size}".encode())
    return digest.hexdigest()[:32]


class _Tee(io.TextIOBase):
    def __init__(self, stream) -> None:
        self.stream = stream
        self.text = io.StringIO()

    def write(self, text: str) -> int:
        self.text.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def cached_help(words: list[str]) -> Iterator[None]:
    """Around a command's run: for a ``--help`` command line, print the cached text and exit
    0 when there is one; otherwise run it and store what it printed if it exited cleanly."""
    if not any(w in HELP_FLAGS for w in words) or not enabled():
        yield
        return
    path = cache_dir() / f"{help_key(words)}.txt"
    if path.is_file():
        sys.stdout.write(path.read_text(encoding="utf-8"))
        sys.stdout.flush()
        raise SystemExit(0)
    tee = _Tee(sys.stdout)
    try:
        with contextlib.redirect_stdout(tee):
            yield
    except SystemExit as stop:
        if stop.code in (0, None):
            _store(path, tee.text.getvalue())
        raise
    _store(path, tee.text.getvalue())


def _store(path: Path, text: str) -> None:
    if not text:
        return
    with contextlib.suppress(OSError):  # an unwritable cache only costs speed
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
