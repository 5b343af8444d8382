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
            ["--model.init_args.compile", "{dynamic: maybe}"],
            "--model.init_args.compile: dynamic must be true, false or null, got 'maybe'",
        ),
        (
            ["--model.compile", "{backend: eager, options: 3}"],
            "--model.init_args.compile: options must be a mapping or null, got 3",
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


@pytest.mark.parametrize(
    ("overlay", "expected"),
    [
        # keys written directly under the section, as jsonargparse also reads them
        ("model:\n  micro_batch_size: true\n", "expected None or int, got True"),
        ("model:\n  micro_batch_size: abc\n", "expected None or int, got 'abc'"),
        # an overlay's init_args add to the recipe's (the class stays the recipe's)
        ("model:\n  init_args:\n    micro_batch_size: 2.5\n", "expected None or int, got 2.5"),
        ("fit:\n  model:\n    compile: {dynamic: maybe}\n",
         "dynamic must be true, false or null, got 'maybe'"),
    ],
)  # fmt: skip
def test_values_in_an_overlay_config_file(tmp_path, overlay, expected):
    (tmp_path / "overlay.yaml").write_text(overlay)
    words = ["fit", "--config", SOP, "--config", str(tmp_path / "overlay.yaml"),
             "--data.init_args.root", str(tmp_path)]  # fmt: skip
    name = "compile" if "compile" in overlay else "micro_batch_size"
    assert early_error(words) == f"--model.init_args.{name}: {expected}"


def test_an_overlay_key_the_class_does_not_take(tmp_path):
    (tmp_path / "overlay.yaml").write_text("model:\n  micro_batch: 8\n")
    words = ["fit", "--config", SOP, "--config", str(tmp_path / "overlay.yaml")]
    assert early_error(words).startswith(
        "model.micro_batch in a config file: MetricLearningModule has no argument 'micro_batch' "
        "(did you mean micro_batch_size?"
    )
    (tmp_path / "overlay.yaml").write_text("model:\n  init_args:\n    micro_batch_size: 8\n")
    words += ["--data.init_args.root", str(tmp_path)]
    assert early_error(words) is None


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
    (tmp_path / "overlay.yaml").write_text("model:\n  micro_batch_size: true\n")
    code = code.replace(
        "'--model.init_args.lrr', '1'", f"'--config', {str(tmp_path / 'overlay.yaml')!r}"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert out.stdout.split() == ["2", "False", "False"]
    assert out.stderr.strip().splitlines() == [
        "rl-gap: error: --model.init_args.micro_batch_size: expected None or int, got True"
    ]


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
