"""A written ``--trainer.limit_val_batches 1`` reaches the Trainer as one batch, not 100%."""

import subprocess
import sys
from pathlib import Path

import pytest

from rl_gap.training.trainer_args import restore_integers, written_integers

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "demo" / "mnist_gsap.yaml"

# sklearn.metrics imported before the CLI parses makes jsonargparse hand the Trainer 1.0
_CHILD = """
import sklearn.metrics, sys
from rl_gap.training.cli import run_lightning_cli
cli = run_lightning_cli(sys.argv[1:], run=False)
t = cli.trainer
print(repr(t.limit_train_batches), repr(t.limit_val_batches), repr(t.limit_test_batches))
"""


def test_integer_limits_stay_counts_whatever_was_imported_first(tmp_path):
    config = tmp_path / "limits.yaml"
    config.write_text("trainer:\n  limit_test_batches: 3\n")
    argv = ["--config", str(RECIPE), "--config", str(config), "--output_dir", str(tmp_path),
            "--wandb", "off", "--trainer.limit_train_batches", "1",
            "--trainer.limit_val_batches=0.5"]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, *argv], cwd=ROOT, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["1", "0.5", "3"]


@pytest.mark.parametrize(
    "words, expected",
    [
        (["--trainer.limit_val_batches", "1"], {"limit_val_batches": 1}),
        (["--trainer.limit_val_batches=2"], {"limit_val_batches": 2}),
        (["--trainer.limit_val_batches", "1.0"], {}),
        (["--trainer.limit_val_batches", "1", "--trainer.limit_val_batches", "0.25"], {}),
        (["--trainer.max_epochs", "1"], {}),
    ],
)
def test_written_integers_reads_the_last_word(words, expected):
    assert written_integers(words) == expected


def test_restore_integers_only_where_the_written_int_became_a_float():
    kwargs = {"limit_val_batches": 1.0, "limit_train_batches": 0.5, "max_epochs": 1}
    restore_integers(kwargs, {"limit_val_batches": 1, "limit_train_batches": 2})
    assert kwargs == {"limit_val_batches": 1, "limit_train_batches": 0.5, "max_epochs": 1}
    assert type(kwargs["limit_val_batches"]) is int
