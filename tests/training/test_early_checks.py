"""Bad keys, values and paths of ``rl-gap fit`` reported in one line before torch loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_gap.cli import main
from rl_gap.training.early_checks import class_signature, early_error

REPO = Path(__file__).resolve().parents[2]
SOP = str(REPO / "recipes" / "metric_learning" / "sop_gsap.yaml")
MOCO = str(REPO / "recipes" / "moco_v3" / "in1k_vit_s_gsap.yaml")


def test_signatures_follow_kwargs_to_the_base_class():
    sop = class_signature("rl_gap.data.metric_learning.SOPDataModule")
    assert {"root", "batch_size", "m_per_class", "mean"} <= set(sop.params) and not sop.open
    assert sop.params["batch_size"] == "int"
    module = class_signature("rl_gap.modules.MetricLearningModule")  # a lazy re-export
    assert {"backbone", "lr", "loss", "allow_split_batch"} <= set(module.params)
    assert class_signature("lightning.pytorch.demos.BoringDataModule") is None


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            ["--model.init_args.lrr", "1e-3"],
            "MetricLearningModule has no argument 'lrr' (did you mean lr?",
        ),
        (
            ["--data.batchsize", "64"],
            "SOPDataModule has no argument 'batchsize' (did you mean batch_size?",
        ),
        (["--trainr.max_epochs", "3"], "unknown key --trainr.max_epochs (did you mean --trainer?)"),
        (
            ["--data.init_args.batch_size", "abc"],
            "--data.init_args.batch_size: expected int, got 'abc'",
        ),
        (
            ["--trainer.accumulate_grad_batches", "4"],
            "accumulate_grad_batches=4 would split each batch",
        ),
    ],
)
def test_bad_key_or_value(tmp_path, extra, expected):
    words = ["fit", "--config", SOP, "--data.init_args.root", str(tmp_path), *extra]
    assert expected in early_error(words)


def test_missing_path_and_config():
    assert (
        early_error(["fit", "--config", SOP]) == "--data.init_args.root: /data/sop does not exist"
    )
    assert "does not exist" in early_error(["fit", "--config", "nope/none.yaml"])
    moco = early_error(["fit", "--config", MOCO, "--data.init_args.train_dir", "/nope"])
    assert moco == "--data.init_args.train_dir: /nope does not exist"


def test_valid_command_lines_pass(tmp_path):
    ok = ["fit", "--config", SOP, "--data.init_args.root", str(tmp_path), "--model.loss.name",
          "msap", "--model.lr", "0.1", "--trainer.accumulate_grad_batches", "4",
          "--model.allow_split_batch", "true", "--data.init_args.batches_per_epoch", "5",
          "--model.init_args.lr", "1e-4", "--model.init_args.weight_decay", "-1e-3"]  # fmt: skip
    assert early_error(ok) is None
    assert early_error(["fit", "--config", SOP, "--print_config"]) is None  # the parser's job
    moco = ["fit", "--config", MOCO, "--data.init_args.train_dir", str(tmp_path),
            "--data.init_args.val_dir", str(tmp_path), "--data.init_args.batches_per_epoch", "3"]  # fmt: skip
    assert early_error(moco) is None


def test_console_reports_one_line_without_importing_torch(tmp_path):
    code = (
        "import sys\nfrom rl_gap.cli import main\n"
        f"rc = main(['fit', '--config', {SOP!r}, '--model.init_args.lrr', '1'])\n"
        "print(rc, 'torch' in sys.modules, 'lightning' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert out.stdout.split() == ["2", "False", "False"]
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("rl-gap: error: --model.init_args.lrr: MetricLearningModule has no")


def test_version(capsys):
    from rl_gap import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"rl-gap {__version__}\n"


@pytest.mark.parametrize(
    "recipe", sorted((REPO / "recipes").glob("*/*.yaml")), ids=lambda p: f"{p.parent.name}/{p.stem}"
)
def test_shipped_recipes_raise_nothing_but_missing_data(recipe):
    problem = early_error(["fit", "--config", str(recipe)])
    if recipe.parent.name == "demo":
        assert problem is None  # the demos bring their data
    else:
        assert problem is None or problem.endswith("does not exist"), problem
