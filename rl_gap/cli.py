"""``rl-gap`` entry point.

``rl-gap fit|validate|test|predict --config recipe.yaml`` is a LightningCLI
(every key overridable on the command line); ``rl-gap evaluate|extrapolate|
linear-probe|knn ...`` are plain sub-commands from ``rl_gap.commands``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rl_gap.commands import COMMANDS


def _run_command(name: str, argv: list[str], one_line_errors: bool = False) -> int:
    """Run a plain sub-command; with ``one_line_errors`` (the console command) a bad input
    (ValueError, OSError: a missing or damaged file, a bad option value, a full disk) is
    one line on stderr and exit status 2, as argparse and ``rl-gap fit`` report them."""
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"rl-gap {name}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(argv)
    if not one_line_errors:
        return int(module.run(args) or 0)
    try:
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
        "usage: rl-gap COMMAND [options]   (rl-gap COMMAND --help for its options)\n\n"
        "commands:\n" + "\n".join(rows) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if not words or words[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0 if words else 2
    if words[0] in COMMANDS:
        # main(argv) from Python raises; the console command prints input errors in one line
        return _run_command(words[0], words[1:], one_line_errors=argv is None)
    if not words[0].startswith("-") and words[0] not in TRAINING_COMMANDS:
        # LightningCLI's own error would list only the training commands
        print(f"rl-gap: error: unknown command {words[0]!r}\n\n{usage()}", end="", file=sys.stderr)
        return 2
    from rl_gap.training.cli import run_lightning_cli

    # LightningCLI reads sys.argv itself when called from the console script.
    run_lightning_cli(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
