"""Trainer options that take either a count (int) or a fraction (float): keep what was written.

Lightning reads ``limit_val_batches: 1`` as one batch and ``1.0`` as the whole set. In
some processes jsonargparse hands the Trainer ``1.0`` for a written ``1`` (observed
whenever ``sklearn.metrics`` was imported before the CLI ran), which silently turns a
one-batch smoke run into a full epoch. The words the user wrote decide: an integer
literal on the command line, or an integer in a YAML config file, reaches the Trainer
as an ``int``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, MutableMapping
from pathlib import Path
from typing import Any

import yaml

#: Trainer keys typed ``int | float``: an int counts batches (or steps), a float is a fraction.
COUNT_OR_FRACTION = (
    "limit_train_batches",
    "limit_val_batches",
    "limit_test_batches",
    "limit_predict_batches",
    "overfit_batches",
    "val_check_interval",
)
_INTEGER = re.compile(r"\+?\d+")


def written_integers(words: Iterable[str], config_files: Iterable[Any] = ()) -> dict[str, int]:
    """``{key: n}`` for every :data:`COUNT_OR_FRACTION` key last written as an integer.

    Config files are read in order, then the command line (later words win, as in the
    CLI); a key whose last written value is not an integer is left out.
    """
    found: dict[str, int] = {}
    for path in config_files:
        try:
            data = yaml.safe_load(Path(str(path)).read_text())
        except (OSError, yaml.YAMLError):
            continue  # the CLI reports unreadable config files itself
        trainer = data.get("trainer") if isinstance(data, dict) else None
        for key in COUNT_OR_FRACTION:
            if isinstance(trainer, dict) and key in trainer:
                value = trainer[key]
                if type(value) is int:
                    found[key] = value
                else:
                    found.pop(key, None)
    words = [str(w) for w in words]
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        key = name.removeprefix("--trainer.")
        if key == name or key not in COUNT_OR_FRACTION:
            continue
        if not eq:
            value = words[i + 1] if i + 1 < len(words) else ""
        if _INTEGER.fullmatch(value.strip()):
            found[key] = int(value)
        else:
            found.pop(key, None)
    return found


def restore_integers(trainer_kwargs: MutableMapping[str, Any], written: dict[str, int]) -> None:
    """Give back the written ``int`` where the Trainer's keyword became that number as a float."""
    for key, value in written.items():
        given = trainer_kwargs.get(key)
        if isinstance(given, float) and given == value:
            trainer_kwargs[key] = value
