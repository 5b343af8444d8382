"""The run a parsed command line describes, and setting errors met while the module is built."""

from __future__ import annotations

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
