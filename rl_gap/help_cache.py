"""``rl-gap ... --help`` printed from a cache of its last output.

Building LightningCLI's help imports torch, Lightning (which imports
torchmetrics, torchvision and ``torch._dynamo``) and every module class: many
seconds for a page of text. The first ``--help`` of a command line runs as
usual and stores what it printed; later ones print the stored text. The key
covers everything the text depends on: the command line, the terminal width,
the Python and library versions, and the size and modification time of every
``rl_gap`` source file and of any file named on the command line (a recipe),
so an edit or an upgrade rebuilds it.

The cache lives in ``$RL_GAP_CACHE_DIR/help`` (default ``~/.cache/rl_gap/help``,
or under ``$XDG_CACHE_HOME``); ``RL_GAP_HELP_CACHE=0`` turns it off.
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

HELP_FLAGS = ("-h", "--help")
LIBRARIES = ("lightning", "jsonargparse", "torch", "timm", "open_clip_torch", "torchmetrics")


def cache_dir() -> Path:
    root = os.environ.get("RL_GAP_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "rl_gap")
    return Path(root) / "help"


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
    package = Path(__file__).resolve().parent
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
    if not any(w in HELP_FLAGS for w in words) or os.environ.get("RL_GAP_HELP_CACHE") == "0":
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
