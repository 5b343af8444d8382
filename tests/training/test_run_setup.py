"""The run a parsed command line describes, and setting errors met while the module is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_gap.losses.registry import LossSectionError
from rl_gap.optim import OptimizerSettingsError
from rl_gap.training.run_setup import setting_error, usage_error


def _wrapped(inner: Exception) -> ValueError:
    """``inner`` as jsonargparse hands it on: inside its Union error, as the context."""
    try:
        try:
            raise inner
        except ValueError:
            raise ValueError("Does not validate against any of the Union subtypes\n...") from None
    except ValueError as outer:
        outer.__context__ = inner
        return outer


def test_setting_errors_are_named_by_their_recipe_key():
    loss = _wrapped(LossSectionError("temperature must be a finite number > 0, got 0"))
    assert setting_error(loss) == "--model.loss: temperature must be a finite number > 0, got 0"
    optim = _wrapped(OptimizerSettingsError("lr must be a finite number > 0, got -1.0"))
    assert setting_error(optim) == "--model.init_args: lr must be a finite number > 0, got -1.0"
    assert setting_error(_wrapped(ValueError("something else"))) is None


def test_usage_error_is_one_line_and_status_2(capsys):
    with pytest.raises(SystemExit) as info:
        usage_error("the reason")
    assert info.value.code == 2
    assert capsys.readouterr().err == "rl-gap: error: the reason\n"


def _union_report(build) -> ValueError:
    """What jsonargparse raises when building a class fails: its Union report, the
    constructor's own error as the cause (``raise ... from exceptions[0]``)."""
    try:
        build()
    except ValueError as inner:
        report = ValueError(
            "Does not validate against any of the Union subtypes\nErrors:\n  - Expected a"
            " <class 'NoneType'>\n  - Problem with given class_path: a DataModule"
        )  # the text names the wrong group on purpose: it is not read
        report.__cause__ = inner
        return report
    raise AssertionError("build() did not fail")


def test_a_constructors_own_refusal_is_named_by_the_class_that_raised_it():
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self, momentum: float) -> None:
            super().__init__()
            _check(momentum)

    class Data(L.LightningDataModule):
        def __init__(self, size: int) -> None:
            super().__init__()
            if size < 1:
                raise ValueError(f"size must be >= 1, got {size}")

    def _check(momentum):  # a helper below the constructor, as models/moco.py has
        if not 0 <= momentum <= 1:
            raise ValueError(f"momentum must lie in [0, 1], got {momentum}")

    model = _union_report(lambda: Module(1.5))
    assert setting_error(model) == "--model.init_args: momentum must lie in [0, 1], got 1.5"
    data = _union_report(lambda: Data(0))
    assert setting_error(data) == "--data.init_args: size must be >= 1, got 0"
    assert setting_error(_union_report(lambda: _check(2.0))) is None  # no module refused it


def test_run_folder_is_named_after_the_recipe_not_an_overlay(tmp_path):
    """``--config recipe.yaml --config data/mb30.yaml``: the folder is the recipe's, and the
    overlay's keys are overrides (a folder of their own, apart from the plain recipe)."""
    from cluster_helpers import RECIPE, fit_argv

    from rl_gap.training.cli import run_lightning_cli

    overlay = tmp_path / "data" / "mb30.yaml"
    overlay.parent.mkdir()
    overlay.write_text("model:\n  init_args:\n    micro_batch_size: 30\n")
    plain = run_lightning_cli(fit_argv(tmp_path, None), run=False)
    layered = run_lightning_cli([*fit_argv(tmp_path, None), "--config", str(overlay)], run=False)
    plain_root = Path(plain.trainer.default_root_dir)
    root = Path(layered.trainer.default_root_dir)
    assert root.parent == plain_root.parent == tmp_path / "demo" / RECIPE.stem
    assert root != plain_root and root.name.startswith("seed0-")
