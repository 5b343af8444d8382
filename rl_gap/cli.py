"""``rl-gap`` entry point.

``rl-gap fit|validate|test|predict --config recipe.yaml`` is a LightningCLI
(every key overridable on the command line); ``rl-gap evaluate|extrapolate|
linear-probe|knn ...`` are plain sub-commands from ``rl_gap.commands``.

Start-up: this module imports nothing heavy; a command imports what it uses.
``rl-gap <command> --help`` is replayed from a recorded spec of the command's
parser (:mod:`rl_gap.help_spec`) without importing torch or Lightning; any other
``--help`` line is printed from a cache once it has been built (:mod:`rl_gap.help_spec.pages`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Callable

from rl_gap.commands import COMMANDS


def show_defaults(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """End every option's help with its default, unless the help already states one.

    Flags (``store_true``) and options without a default (None) are left as they are.
    """
    for action in parser._actions:
        shown = action.help or ""
        if (
            not action.option_strings
            or action.nargs == 0
            or action.default in (None, argparse.SUPPRESS)
            or action.help == argparse.SUPPRESS
            or "default" in shown.lower()
        ):
            continue
        action.help = f"{shown} (default: %(default)s)".strip()
    return parser


# plain commands whose result goes to a W&B run of its own (rl_gap.training.wandb_mode)
WANDB_COMMANDS = ("evaluate", "knn", "linear-probe", "extrapolate")


def build_parser(name: str) -> tuple[argparse.ArgumentParser, object]:
    """The argparse parser of sub-command ``name`` (its defaults shown in --help) and its module."""
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"rl-gap {name}", description=help_text)
    module.add_arguments(parser)
    if name in WANDB_COMMANDS:
        parser.add_argument(
            "--wandb", choices=("auto", "online", "offline", "off"), default="auto",
            help="log the result to a W&B run of its own, in the training run's group "
            "(auto: only where W&B finds credentials: WANDB_API_KEY, `wandb login`)",
        )  # fmt: skip
        parser.add_argument("--wandb_project", default="rl_gap", help="W&B project")
    return show_defaults(parser), module


def _wandb_context(name: str, args: argparse.Namespace) -> contextlib.AbstractContextManager:
    """The command's W&B run (``--wandb``), or nothing; wandb is imported only when on."""
    if name not in WANDB_COMMANDS:
        return contextlib.nullcontext()
    from rl_gap.training.wandb_mode import command_wandb_run

    return command_wandb_run(name, args, args.wandb, args.wandb_project)


def _run_command(name: str, argv: list[str], one_line_errors: bool = False) -> int:
    """Run a plain sub-command; with ``one_line_errors`` (the console command) a bad input
    (ValueError, OSError: a missing or damaged file, a bad option value, a full disk) is
    one line on stderr and exit status 2, as argparse and ``rl-gap fit`` report them."""
    parser, module = build_parser(name)
    args = parser.parse_args(argv)
    if not one_line_errors:
        with _wandb_context(name, args):
            return int(module.run(args) or 0)
    try:
        with _wandb_context(name, args):
            return int(module.run(args) or 0)
    except (ValueError, OSError) as err:
        print(f"rl-gap {name}: error: {err}", file=sys.stderr)
        return 2


TRAINING_COMMANDS = {
    "fit": "train a recipe (LightningCLI: --config recipe.yaml, any key overridable)",
    "validate": "one evaluation epoch on the validation set (--ckpt_path ...)",
    "test": "one evaluation epoch on the test set (--ckpt_path ...)",
    "predict": "run the model's predict loop",
}


def usage() -> str:
    width = max(map(len, [*TRAINING_COMMANDS, *COMMANDS]))
    rows = [f"  {k:<{width}}  {v}" for k, v in TRAINING_COMMANDS.items()]
    rows += [f"  {k:<{width}}  {help_text}" for k, (_, help_text) in COMMANDS.items()]
    return (
        "usage: rl-gap COMMAND [options]   (rl-gap COMMAND --help for its options; "
        "rl-gap --version)\n\n"
        "commands:\n" + "\n".join(rows) + "\n\n"
        "--quiet: no progress bar (on a training command: --trainer.enable_progress_bar false)\n"
    )


def run_training_command(argv: list[str] | None) -> int:
    from rl_gap.training.stop_request import listen_for_sigterm

    listen_for_sigterm()  # a SIGTERM while torch/Lightning load is recorded, not fatal
    # Every module class known to jsonargparse: short class names and --help list them.
    import rl_gap.modules as modules
    from rl_gap.training.cli import run_lightning_cli

    for name in modules.__all__:
        getattr(modules, name)
    # LightningCLI reads sys.argv itself when called from the console script.
    run_lightning_cli(argv)
    return 0


def _replayed_help(command: str) -> bool:
    """Print ``rl-gap <command> --help`` from the help spec and exit 0 (as argparse's help
    does), or return False when the spec holds no valid page for it."""
    from rl_gap import help_spec

    if help_spec.print_help(command):
        raise SystemExit(0)
    return False


def _training_help(command: str, argv: list[str] | None) -> int:
    """``rl-gap <command> --help`` replayed from the help spec, else live (which records it)."""
    from rl_gap import help_spec

    _replayed_help(command)
    if not help_spec.enabled():
        return run_training_command(argv)
    with help_spec.recording(plain_parsers=plain_parsers()):
        return run_training_command(argv)


def plain_parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    """Name -> builder of each plain sub-command's parser (what the help record stores)."""
    return {name: (lambda n=name: build_parser(n)[0]) for name in COMMANDS}


def cached_help(words: list[str]) -> contextlib.AbstractContextManager:
    """The help cache around a ``--help`` command line; nothing for any other."""
    if not any(word in ("-h", "--help") for word in words):
        return contextlib.nullcontext()
    from rl_gap.help_spec.pages import cached_help as cache

    return cache(words)


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] in (["--version"], ["-V"]):
        from rl_gap import __version__

        print(f"rl-gap {__version__}")
        return 0
    if not words or words[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0 if words else 2
    if words[0] in COMMANDS:
        if words[1:] in (["--help"], ["-h"]):
            _replayed_help(words[0])
        # main(argv) from Python raises; the console command prints input errors in one line
        with cached_help(words):
            return _run_command(words[0], words[1:], one_line_errors=argv is None)
    if not words[0].startswith("-") and words[0] not in TRAINING_COMMANDS:
        # LightningCLI's own error would list only the training commands
        print(f"rl-gap: error: unknown command {words[0]!r}\n\n{usage()}", end="", file=sys.stderr)
        return 2
    if words[1:] in (["--help"], ["-h"]):
        return _training_help(words[0], argv)
    if "--quiet" in words[1:]:
        quiet_words = quiet_training_words(words)
        argv = quiet_words
        if sys.argv[1:] == words:  # the console script: LightningCLI reads sys.argv
            sys.argv[1:], argv = quiet_words, None
        words = quiet_words
    from rl_gap.training.early_checks import early_error

    problem = early_error(words)  # before torch and Lightning load (seconds)
    if problem:
        print(f"rl-gap: error: {problem}", file=sys.stderr)
        return 2
    with cached_help(words):
        return run_training_command(argv)


def quiet_training_words(words: list[str]) -> list[str]:
    """``--quiet`` on a training command (``fit``, ``predict``, ...) is
    ``--trainer.enable_progress_bar false``, as on the other long commands."""
    return [w for w in words if w != "--quiet"] + ["--trainer.enable_progress_bar", "false"]


if __name__ == "__main__":
    sys.exit(main())
