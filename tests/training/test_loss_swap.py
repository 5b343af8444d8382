"""A loss swap takes the new loss's own hyperparameters, never the previous loss's.

The references are the recipes' own per-loss tables, read here with plain
``yaml.safe_load``, and the losses' signatures (their defaults): after
``--model.loss.name X`` the loss is built with X's table, else X's defaults; a
command-line value wins; ``--print_config`` shows the block as it will be built.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from rl_gap.losses import get_loss_class, loss_from_config
from rl_gap.training.cli import run_lightning_cli

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "recipes" / "demo" / "mnist_distractor_gsap.yaml"
RECIPES = sorted((ROOT / "recipes").glob("*/*.yaml"))


def _loss_section(path: Path) -> dict:
    return yaml.safe_load(path.read_text())["model"]["init_args"]["loss"]


def _build(tmp_path, *overrides):
    argv = ["--config", str(DEMO), "--trainer.logger", "false", "--run_name", str(tmp_path)]
    return run_lightning_cli([*argv, *overrides], run=False).model.loss_fn


def _printed_loss(capsys, recipe: Path, *overrides) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", "--config", str(recipe), *overrides, "--print_config"])
    assert exit_info.value.code == 0
    return yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]["loss"]


def test_mnist_distractor_swap_to_infonce_gets_infonces_own_temperature(tmp_path):
    table = _loss_section(DEMO)
    assert table["infonce"]["temperature"] != table["gsap"]["temperature"]
    loss = _build(tmp_path, "--model.loss.name", "infonce")
    assert type(loss) is get_loss_class("infonce")
    assert loss.temperature == pytest.approx(table["infonce"]["temperature"])  # 0.05, not 0.01
    msap = _build(tmp_path, "--model.loss.name", "msap")
    assert msap.temperature == pytest.approx(table["msap"]["temperature"])


def test_command_line_value_wins_over_the_table(tmp_path):
    loss = _build(tmp_path, "--model.loss.name", "infonce", "--model.loss.temperature", "0.2")
    assert loss.temperature == pytest.approx(0.2)
    loss = _build(
        tmp_path, "--model.loss.name", "infonce", "--model.loss.infonce.temperature", "0.1"
    )
    assert loss.temperature == pytest.approx(0.1)
    loss = _build(tmp_path, "--model.loss.gsap.neg_drop", "0.5")
    assert loss.neg_drop == pytest.approx(0.5)


def test_a_loss_without_a_table_gets_its_own_defaults(tmp_path):
    loss = _build(tmp_path, "--model.loss.name", "gsoftbin")
    defaults = inspect.signature(get_loss_class("gsoftbin").__init__).parameters
    assert loss.num_bins == defaults["num_bins"].default
    assert loss.neg_drop == defaults["neg_drop"].default  # not gSAP's table


@pytest.mark.parametrize(
    "override, named",
    [
        (["--model.loss.msap.neg_dropp", "0.5"], ["'msap'", "'neg_dropp'", "'neg_drop'"]),
        (["--model.loss.gsapp.temperature", "0.1"], ["'gsapp'"]),
        (
            ["--model.loss.name", "infonce", "--model.loss.neg_drop", "0.5"],
            ["'neg_drop'", "infonce"],
        ),
    ],
)
def test_unknown_table_key_is_rejected_with_its_name(capsys, override, named):
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", "--config", str(DEMO), *override, "--print_config"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if "error:" in line)
    assert all(word in line for word in named), line


def test_python_api_tables_and_errors():
    from rl_gap.losses.registry import read_loss_section

    section = {
        "name": "msap",
        "gsap": {"temperature": 0.001, "neg_drop": 0.9},
        "msap": {"temperature": 0.01},
    }
    chosen = read_loss_section(section)
    assert {"name": chosen.name, **chosen.kwargs} == {"name": "msap", "temperature": 0.01}
    loss = loss_from_config(section)
    assert (loss.temperature, loss.neg_drop) == (0.01, 0.0)
    with pytest.raises(ValueError, match="'msap'.*'tau'"):
        loss_from_config({"name": "gsap", "msap": {"tau": 0.1}})
    with pytest.raises(ValueError, match="must be a mapping"):
        loss_from_config({"name": "gsap", "msap": 0.1})
    with pytest.raises(ValueError, match="'neg_drop'"):
        loss_from_config({"name": "infonce", "temperature": 0.05, "neg_drop": 0.9})


def test_print_config_shows_the_loss_block_as_built(capsys):
    printed = _printed_loss(capsys, DEMO, "--model.loss.name", "infonce")
    assert printed["name"] == "infonce"
    params = inspect.signature(get_loss_class("infonce").__init__).parameters
    expected = {k: p.default for k, p in params.items() if k != "self"}
    expected["temperature"] = _loss_section(DEMO)["infonce"]["temperature"]
    assert printed["infonce"] == expected
    printed = _printed_loss(capsys, DEMO, "--model.loss.temperature", "0.003")
    assert printed["gsap"]["temperature"] == 0.003 and "temperature" not in printed


def test_flat_recipe_keys_are_not_carried_to_another_loss(tmp_path, capsys):
    text = DEMO.read_text().split("\n")
    start = text.index("    loss:")
    end = next(i for i in range(start + 1, len(text)) if not text[i].startswith("      "))
    text[start:end] = [
        "    loss:",
        "      name: gsap",
        "      temperature: 0.001",
        "      neg_drop: 0.9",
    ]
    flat = tmp_path / "flat_gsap.yaml"
    flat.write_text("\n".join(text))
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(
            ["fit", "--config", str(flat), "--model.loss.name", "msap", "--print_config"]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "loss.gsap.temperature" in err and "loss.gsap.neg_drop" in err
    # unswapped, the flat keys are the recipe's own loss's values
    assert _printed_loss(capsys, flat)["gsap"]["neg_drop"] == 0.9


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_shipped_recipes_keep_hyperparameters_in_per_loss_tables(recipe):
    from rl_gap.losses.registry import read_loss_section

    section = _loss_section(recipe)
    flat = {k for k in section if k != "name" and not isinstance(section[k], dict)}
    assert not flat, f"{recipe}: {flat} outside a per-loss table"
    assert section["name"] in section, "the recipe's own loss has a table"
    for name, table in section.items():
        if name == "name":
            continue
        swapped = {**section, "name": name}
        chosen = read_loss_section(swapped)
        assert {"name": chosen.name, **chosen.kwargs} == {"name": name, **table}
        built = loss_from_config(swapped)
        for key, value in table.items():
            if hasattr(built, key):  # SigLIP keeps init_* as its learnt parameters
                assert getattr(built, key) == pytest.approx(value), (recipe, name, key)
    # negative dropping is gSAP's alone (gSAP paper §C.3/§C.4): mSAP drops nothing
    assert section.get("msap", {}).get("neg_drop", 0.0) == 0.0
