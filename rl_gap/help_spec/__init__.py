"""``rl-gap <command> --help`` without importing torch or Lightning.

LightningCLI builds its help from a parser that needs torch, Lightning and every
module class: seconds of imports for a page of text. This module stores the
*structure* of the help pages of ``fit``, ``validate``, ``test``, ``predict`` and
of the plain sub-commands (``extrapolate``, ``evaluate``, ...): usage actions,
groups, each option's invocation and its expanded help text, as jsonargparse or
argparse format them. It replays them through the standard library's
``argparse.HelpFormatter``, which wraps the text to the terminal width exactly as
the live parser would.

The spec is written by ``python -m rl_gap.help_spec`` (``make venv`` runs it after
the install) and by any live ``rl-gap fit|validate|test|predict --help``. It is used only while
its key matches; the key covers every input of the text:

- the Python version (argparse's layout);
- the name and version of every installed distribution (the ``*.dist-info`` entries
  on ``sys.path``: an upgrade, install or removal changes it);
- the content of every file of the ``rl_gap`` package;
- the environment variables jsonargparse and Lightning read (``JSONARGPARSE_*``,
  ``PL_*``, ``LIGHTNING_*``).

A spec whose key differs is stale: the live help runs and writes a new spec.
The spec lives in the package folder (``rl_gap/help_spec.json``), or, where that is
not writable, in the help cache folder (:mod:`rl_gap.help_spec.pages`, which also keeps
the other ``--help`` lines as printed text); ``RL_GAP_HELP_SPEC`` names another file and
``RL_GAP_HELP_CACHE=0`` turns replay, recording and the pages off.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rl_gap.help_spec import pages

COMMANDS = ("fit", "validate", "test", "predict")
FORMAT = 1
SPEC_NAME = "help_spec.json"
ENV_PREFIXES = ("JSONARGPARSE_", "PL_", "LIGHTNING_")
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # rl_gap/
PROG = "{prog}"  # stands for the program name in a stored prog
last_recording: dict[str, Any] = {}  # what the latest recording() saw (tests read the parser)


def spec_paths() -> list[Path]:
    """Where a spec is read from, first match wins (and written to, first writable)."""
    if os.environ.get("RL_GAP_HELP_SPEC"):
        return [Path(os.environ["RL_GAP_HELP_SPEC"])]
    return [PACKAGE_DIR / SPEC_NAME, pages.cache_dir() / SPEC_NAME]


def _package_files(root: Path) -> list[Path]:
    skip_suffixes = (".pyc", ".so", ".tmp")
    return sorted(
        path
        for path in root.rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and path.name != SPEC_NAME
        and not path.name.endswith(skip_suffixes)
    )


def installed_distributions() -> list[str]:
    """Names of the ``*.dist-info`` entries on ``sys.path`` (name and version), and of the
    ``*.egg-info`` ones in ``site-packages``: a source checkout's own ``*.egg-info`` (build
    metadata) would make the key depend on the working directory."""
    found = set()
    for entry in sys.path:
        folder = entry or "."
        installed = os.path.basename(os.path.normpath(folder)) in ("site-packages", "dist-packages")
        suffixes = (".dist-info", ".egg-info") if installed else (".dist-info",)
        with contextlib.suppress(OSError):
            found.update(name for name in os.listdir(folder) if name.endswith(suffixes))
    return sorted(found)


def current_key(package_dir: Path | None = None) -> str:
    """Hash of every input of the help text (see the module docstring)."""
    root = package_dir or PACKAGE_DIR
    digest = hashlib.sha256()
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(ENV_PREFIXES))
    digest.update(json.dumps([FORMAT, sys.version, installed_distributions(), env]).encode())
    for path in _package_files(root):
        digest.update(f"{path.relative_to(root).as_posix()}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


# ------------------------------------------------------------------------------- replay
class _SpecAction(argparse.Action):
    """An option as the help formatter sees it, restored from the spec."""

    def __init__(self, record: dict[str, Any]) -> None:
        metavar = record["metavar"]
        super().__init__(
            option_strings=record["option_strings"],
            dest=record["dest"],
            nargs=record["nargs"],
            required=record["required"],
            metavar=tuple(metavar) if isinstance(metavar, list) else metavar,
            choices=record["choices"],
            help=argparse.SUPPRESS if record["suppressed"] else record["help"],
        )
        self.invocation = record["invocation"]
        self.default_metavar = record["default_metavar"]
        self.usage_part = record["usage_part"]
        self.subactions = [_SpecAction(sub) for sub in record["subactions"]]

    def format_usage(self) -> str:
        return self.usage_part

    def _get_subactions(self) -> list[argparse.Action]:
        return self.subactions


class _SpecFormatter(argparse.HelpFormatter):
    """The standard layout (wrapping, indentation) over texts jsonargparse already expanded."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        return action.invocation  # type: ignore[attr-defined]

    def _expand_help(self, action: argparse.Action) -> str:
        return str(action.help)

    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        return action.default_metavar  # type: ignore[attr-defined]

    _get_default_metavar_for_positional = _get_default_metavar_for_optional


def render(page: dict[str, Any], prog: str | None = None) -> str:
    """The help text of one stored page, wrapped to this terminal (argparse's ``format_help``)."""
    program = prog if prog is not None else os.path.basename(sys.argv[0])
    actions = [_SpecAction(record) for record in page["actions"]]
    formatter = _SpecFormatter(
        prog=page["prog"].replace(PROG, program),
        indent_increment=page["indent_increment"],
        max_help_position=page["max_help_position"],
    )
    exclusive = [
        SimpleNamespace(required=g["required"], _group_actions=[actions[i] for i in g["actions"]])
        for g in page.get("exclusive", [])
    ]
    formatter.add_usage(page["usage"], [actions[i] for i in page["usage_actions"]], exclusive)
    formatter.add_text(page["description"])
    for group in page["groups"]:
        formatter.start_section(group["title"])
        formatter.add_text(group["description"])
        formatter.add_arguments([actions[i] for i in group["actions"]])
        formatter.end_section()
    formatter.add_text(page["epilog"])
    return formatter.format_help()


def load_valid_spec() -> dict[str, Any] | None:
    """The first spec whose key matches this installation, else None."""
    key = None
    for path in spec_paths():
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        key = key or current_key()
        if isinstance(spec, dict) and spec.get("key") == key:
            return spec
    return None


enabled = pages.enabled  # one switch for the record's replay/recording and the pages


def print_help(command: str) -> bool:
    """Print ``rl-gap <command> --help`` from a valid spec; False when there is none."""
    if not enabled():
        return False
    spec = load_valid_spec()
    page = (spec or {}).get("commands", {}).get(command)
    if page is None:
        return False
    sys.stdout.write(render(page))
    sys.stdout.flush()
    return True


# ---------------------------------------------------------------------------- recording
def _recording_formatter(base: type, invocations: dict, texts: dict, usage: list) -> type:
    """``base`` (jsonargparse's formatter) noting what it computes for each action."""

    class Recorder(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._stack: list = []  # the action being formatted (subactions nest)

        def _format_action_invocation(self, action):
            invocations[id(action)] = text = super()._format_action_invocation(action)
            return text

        def _format_action(self, action):
            self._stack.append(action)
            try:
                return super()._format_action(action)
            finally:
                self._stack.pop()

        def _split_lines(self, text, width):
            texts[id(self._stack[-1])] = text
            return super()._split_lines(text, width)

        def _format_actions_usage(self, actions, groups):
            if not usage:  # the first call formats every usage action at once
                usage.append(list(actions))
            return super()._format_actions_usage(actions, groups)

    return Recorder


def _action_record(action, formatter, invocations, texts) -> dict[str, Any]:
    metavar = action.metavar
    default_metavar = (
        formatter._get_default_metavar_for_optional(action)
        if action.option_strings
        else formatter._get_default_metavar_for_positional(action)
    )
    return {
        "option_strings": list(action.option_strings),
        "dest": action.dest,
        "nargs": action.nargs,
        "required": bool(action.required),
        "metavar": list(metavar) if isinstance(metavar, tuple) else metavar,
        "choices": None if action.choices is None else [str(c) for c in action.choices],
        "suppressed": action.help == argparse.SUPPRESS,
        "help": texts.get(id(action)),
        "invocation": invocations.get(id(action), ""),
        "default_metavar": default_metavar,
        "usage_part": action.format_usage() if action.option_strings else "",
        "subactions": [
            _action_record(sub, formatter, invocations, texts)
            for sub in formatter._iter_indented_subactions(action)
        ],
    }


def record_page(parser, program: str | None = None) -> tuple[dict[str, Any], str]:
    """(stored page, the live help text) of an argparse/jsonargparse parser; a prog that
    starts with ``program`` is stored with the program name left open."""
    invocations: dict[int, str] = {}
    texts: dict[int, str] = {}
    usage: list[list] = []
    live_class = parser.formatter_class
    parser.formatter_class = _recording_formatter(live_class, invocations, texts, usage)
    try:
        live = parser.format_help()
    finally:
        parser.formatter_class = live_class
    formatter = live_class(prog=parser.prog)
    table: dict[int, int] = {}
    records: list[dict[str, Any]] = []
    exclusive = parser._mutually_exclusive_groups
    grouped = [a for g in [*parser._action_groups, *exclusive] for a in g._group_actions]
    for action in [*usage[0], *grouped]:
        if id(action) not in table:
            table[id(action)] = len(records)
            records.append(_action_record(action, formatter, invocations, texts))
    prog = parser.prog
    if program and prog.startswith(program):
        prog = PROG + prog[len(program) :]
    page = {
        "prog": prog,
        "usage": parser.usage,
        "description": parser.description,
        "epilog": parser.epilog,
        "indent_increment": formatter._indent_increment,
        "max_help_position": formatter._max_help_position,
        "usage_actions": [table[id(a)] for a in usage[0]],
        "groups": [
            {
                "title": group.title,
                "description": group.description,
                "actions": [table[id(a)] for a in group._group_actions],
            }
            for group in parser._action_groups
        ],
        "exclusive": [
            {
                "required": bool(group.required),
                "actions": [table[id(a)] for a in group._group_actions],
            }
            for group in exclusive
        ],
        "actions": records,
    }
    return page, live


def record_spec(
    top_parser, program: str, plain_parsers: Mapping[str, Callable[[], Any]] | None = None
) -> dict[str, Any]:
    """The spec of every training command's help page, checked against the live text, and
    of the plain sub-commands whose parsers ``plain_parsers`` builds (name -> builder)."""
    subcommands = top_parser._subcommands_action._name_parser_map
    commands = {}
    for name in COMMANDS:
        page, live = record_page(subcommands[name], program)
        replayed = render(page, program)
        if replayed != live:  # a layout this replay does not reproduce: store nothing
            raise ValueError(f"the stored help of {name!r} differs from the live help")
        commands[name] = page
    plain = plain_pages(plain_parsers or {})
    return {"format": FORMAT, "key": current_key(), "commands": {**commands, **plain}}


def plain_pages(plain_parsers: Mapping[str, Callable[[], Any]]) -> dict[str, dict[str, Any]]:
    """The help pages of the plain sub-commands (``evaluate``, ``extrapolate``, ...), each
    checked against its live text (a page this replay does not reproduce is left out)."""
    pages = {}
    for name, build_parser in plain_parsers.items():
        page, live = record_page(build_parser())
        if render(page) == live:
            pages[name] = page
    return pages


def write_spec(spec: dict[str, Any]) -> Path | None:
    """Write ``spec`` to the first writable spec path (atomically); None if none is."""
    text = json.dumps(spec, separators=(",", ":"))
    for path in spec_paths():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            partial.write_text(text, encoding="utf-8")
            os.replace(partial, path)
            return path
        except OSError:
            continue
    return None


@contextlib.contextmanager
def recording(
    on_record=write_spec, plain_parsers: Mapping[str, Callable[[], Any]] | None = None
) -> Iterator[dict[str, Any]]:
    """Around a live ``rl-gap <command> --help``: when a training command's parser formats
    its help, record the spec of all four pages (and of the plain sub-commands that
    ``plain_parsers`` builds) and pass it to ``on_record`` (by default, write it). Yields a
    dict that then holds ``spec`` and ``parser`` (the top parser)."""
    from jsonargparse import ArgumentParser

    program = os.path.basename(sys.argv[0])
    seen: dict[str, Any] = {}
    global last_recording
    last_recording = seen
    original = ArgumentParser.format_help

    def format_help(parser, *args, **kwargs):
        top = getattr(parser, "parent_parser", None)
        action = getattr(top, "_subcommands_action", None)
        if "spec" not in seen and action is not None and parser in action._name_parser_map.values():
            seen["spec"] = None  # the recording formats the pages itself
            with contextlib.suppress(ValueError, KeyError):
                seen["spec"] = record_spec(top, program, plain_parsers)
                seen["parser"] = top
                on_record(seen["spec"])
        return original(parser, *args, **kwargs)

    ArgumentParser.format_help = format_help
    try:
        yield seen
    finally:
        ArgumentParser.format_help = original
