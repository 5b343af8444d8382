"""A recipe's ``loss:`` section is read in one place, ``registry.read_loss_section``.

References are written out by hand: the sections, the keywords each loss is built with,
and the loss classes' own signatures (``inspect``) for the expanded ``--print_config`` block.
"""

from __future__ import annotations

import inspect

import pytest
from jsonargparse import Namespace

from rl_gap.losses import get_loss_class, loss_from_config
from rl_gap.losses.registry import DEFAULT_LOSS_NAME, LossSectionError, read_loss_section

PAPER = {
    "name": "msap",
    "gsap": {"temperature": 0.001, "neg_drop": 0.9},
    "msap": {"temperature": 0.01},
}


def test_name_and_keywords_table_then_flat_keys():
    section = read_loss_section({**PAPER, "symmetric": True})
    assert section.name == "msap"
    assert section.kwargs == {"temperature": 0.01, "symmetric": True}
    assert section.tables == {"gsap": PAPER["gsap"], "msap": PAPER["msap"]}
    assert section.flat == {"symmetric": True}
    # a flat key wins over the chosen loss's table (a command-line override)
    assert read_loss_section({**PAPER, "temperature": 0.5}).kwargs == {"temperature": 0.5}


def test_default_loss_and_namespace_input():
    assert DEFAULT_LOSS_NAME == "gsap"
    assert read_loss_section(None).name == "gsap"
    assert read_loss_section({"temperature": 0.2}).kwargs == {"temperature": 0.2}
    assert read_loss_section(None, default="infonce").name == "infonce"
    parsed = Namespace(name="GSAP", gsap=Namespace(temperature=0.003))
    section = read_loss_section(parsed)
    assert (section.name, section.kwargs) == ("gsap", {"temperature": 0.003})


def test_build_uses_the_chosen_loss_and_its_own_value_checks():
    loss = read_loss_section(PAPER).build()
    assert type(loss) is get_loss_class("msap")
    assert (loss.temperature, loss.neg_drop) == (0.01, 0.0)  # never gSAP's 0.9
    with pytest.raises(LossSectionError, match=r"^temperature must be a finite number > 0"):
        read_loss_section({"name": "gsap", "gsap": {"temperature": 0}}).build()


@pytest.mark.parametrize(
    "section, message",
    [
        ({"name": "gsp"}, r"^unknown loss 'gsp'; known losses: .*gsap.*infonce.*msap"),
        ({"name": "gsap", "msap": 0.1}, r"^loss table 'msap' must be a mapping of msap's keywords"),
        ({"name": "gsap", "msap": {"tau": 0.1}}, r"^loss table 'msap' has unknown key\(s\) \['tau'\]"),
        (
            {"name": "infonce", "neg_drop": 0.9},
            r"^loss 'infonce' does not take \['neg_drop'\] .*belong to other losses.*loss\.<that loss>\.neg_drop",
        ),
        (
            {"name": "gsap", "temprature": 0.1},
            r"^loss 'gsap' does not take \['temprature'\] .*per-loss tables are named after",
        ),
        ([1, 2], r"^the loss section must be a mapping"),
    ],
)  # fmt: skip
def test_each_bad_section_is_one_line_naming_the_key(section, message):
    with pytest.raises(LossSectionError, match=message) as info:
        read_loss_section(section)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)  # callers catching ValueError keep working


def test_a_recipes_flat_keys_never_reach_a_swapped_in_loss():
    recipe = {"name": "gsap", "temperature": 0.001, "neg_drop": 0.9}
    merged = {**recipe, "name": "msap"}  # --model.loss.name msap on that recipe
    with pytest.raises(LossSectionError) as info:
        read_loss_section({"name": "msap"}, recipes=[("flat.yaml", recipe)])
    text = str(info.value)
    assert text.startswith("flat.yaml sets ['neg_drop', 'temperature'] for 'gsap'")
    assert "loss.gsap.temperature" in text and "loss.gsap.neg_drop" in text
    with pytest.raises(LossSectionError, match="flat.yaml sets"):
        read_loss_section(merged, recipes=[("flat.yaml", recipe)])
    # unswapped, or with the values in tables, the recipe is fine
    assert read_loss_section(recipe, recipes=[("flat.yaml", recipe)]).kwargs == {
        "temperature": 0.001,
        "neg_drop": 0.9,
    }
    assert read_loss_section({"name": "msap"}, recipes=[("t.yaml", PAPER), ("n.yaml", None)])


def test_print_config_block_has_every_keyword_of_the_chosen_loss():
    params = inspect.signature(get_loss_class("msap").__init__).parameters
    defaults = {k: p.default for k, p in params.items() if k != "self"}
    block = read_loss_section({**PAPER, "symmetric": True}).as_recipe(expand=True)
    assert block == {
        "name": "msap",
        "gsap": PAPER["gsap"],
        "msap": {**defaults, "temperature": 0.01, "symmetric": True},
    }
    assert read_loss_section({"name": "gsap", "temperature": 0.1}).as_recipe() == {
        "name": "gsap",
        "gsap": {"temperature": 0.1},
    }


def test_the_reader_answers_name_tables_flat_keys_kwargs_and_recipe():
    section = read_loss_section(PAPER)
    assert (section.name, section.tables, section.flat) == (
        "msap",
        {"gsap": PAPER["gsap"], "msap": PAPER["msap"]},
        {},
    )
    assert {"name": section.name, **section.kwargs} == {"name": "msap", "temperature": 0.01}
    assert read_loss_section({"name": "gsap", "neg_drop": 0.5}).as_recipe() == {
        "name": "gsap",
        "gsap": {"neg_drop": 0.5},
    }
    assert loss_from_config(PAPER).temperature == 0.01
    with pytest.raises(LossSectionError, match="unknown loss 'nope'"):
        loss_from_config({"name": "nope"})
