"""Batch-splitting trainer settings are refused for a ranking loss, unless opted in.

``trainer.accumulate_grad_batches: k`` hands the loss k parts of each batch: gSAP would
rank k lists of B/k instead of one list of B. ``rl-gap fit`` refuses it at parse time
(one line naming what would change and ``micro_batch_size``); the module refuses it at
``setup`` for Python users (also a ``GradientAccumulationScheduler``);
``--model.allow_split_batch true`` lets it through.
"""

from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.callbacks import GradientAccumulationScheduler

from rl_gap.training.cli import run_lightning_cli
from tests.modules.micro_batch_cases import make_module

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "demo" / "mnist_gsap.yaml")


def _parse(*extra):
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", "--config", RECIPE, *extra, "--print_config"])
    return exit_info.value.code


def test_accumulation_is_refused_at_start_up_with_one_line(capsys):
    assert _parse("--trainer.accumulate_grad_batches", "4") == 2
    out, err = capsys.readouterr()
    assert "trainer:" not in out  # refused before anything is printed or built
    (line,) = [line for line in err.splitlines() if line.strip()]  # one line, no usage block
    for words in ("accumulate_grad_batches=4", "4 lists of B/4 instead of one list of B",
                  "--model.micro_batch_size", "--model.allow_split_batch true"):  # fmt: skip
        assert words in line, line


def test_accumulation_with_the_opt_in_and_micro_batches_parse(capsys):
    assert (
        _parse("--trainer.accumulate_grad_batches", "4", "--model.allow_split_batch", "true") == 0
    )
    assert "accumulate_grad_batches: 4" in capsys.readouterr().out
    assert _parse("--trainer.accumulate_grad_batches", "1", "--model.micro_batch_size", "16") == 0
    assert "micro_batch_size: 16" in capsys.readouterr().out


@pytest.mark.parametrize(
    "trainer_args",
    [{"accumulate_grad_batches": 2}, {"callbacks": [GradientAccumulationScheduler({0: 1, 1: 3})]}],
)
def test_module_refuses_split_batches_at_setup(trainer_args):
    trainer = L.Trainer(logger=False, enable_checkpointing=False, **trainer_args)
    module = make_module("metric", "gsap")
    module.trainer = trainer
    with pytest.raises(ValueError, match="would split each batch into .*micro_batch_size"):
        module.setup("fit")
    make_module("metric", "gsap", allow_split_batch=True).setup("fit")  # opted in
