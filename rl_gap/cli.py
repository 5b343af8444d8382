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


def _run_command(name: str, argv: list[str]) -> int:
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"rl-gap {name}", description=help_text)
    module.add_arguments(parser)
    return int(module.run(parser.parse_args(argv)) or 0)


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
        return _run_command(words[0], words[1:])
    if not words[0].startswith("-") and words[0] not in TRAINING_COMMANDS:
        # LightningCLI's own error would list only the training commands
        print(f"rl-gap: error: unknown command {words[0]!r}\n\n{usage()}", end="", file=sys.stderr)
        return 2
    from rl_gap.training.stop_request import listen_for_sigterm

    listen_for_sigterm()  # a SIGTERM while torch/Lightning load is recorded, not fatal
    from rl_gap.training.cli import run_lightning_cli

    # LightningCLI reads sys.argv itself when called from the console script.
    run_lightning_cli(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
