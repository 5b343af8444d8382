"""``variant_of``: a loss variant's keywords are its parent's, less some, plus its own.

The expected keyword lists and defaults are written out by hand here (the published
loss surface), not read from the code under test.
"""

from __future__ import annotations

import inspect

import pytest

from rl_gap.losses import get_loss_class
from rl_gap.losses.variant import variant_of

SUPAP = {
    "temperature": 0.01,
    "rho": 100.0,
    "offset": 1.44,
    "margin": 0.05,
    "neg_drop": 0.0,
    "chunk_size": None,
    "start": 0.5,
}
CALIBRATION = {"pos_margin": 0.9, "neg_margin": 0.6, "calibration_weight": 1.0}


def _defaults(name: str) -> dict:
    params = inspect.signature(get_loss_class(name).__init__).parameters
    return {k: p.default for k, p in params.items() if k != "self"}


@pytest.mark.parametrize(
    "name, expected",
    [
        ("supap", {**SUPAP, "symmetric": False}),
        ("gsupap", SUPAP),
        ("roadmap", {**SUPAP, "symmetric": False, **CALIBRATION}),
        ("groadmap", {**SUPAP, **CALIBRATION}),
        ("gblackbox", {"lambda_val": 4.0, "margin": 0.02, "neg_drop": 0.0}),
        ("gsoftbin", {"num_bins": 10, "sim_range": (-1.0, 1.0), "neg_drop": 0.0}),
    ],
)
def test_a_variant_advertises_its_parents_keywords_and_its_own(name, expected):
    assert _defaults(name) == expected


@pytest.mark.parametrize("name", ["gsupap", "groadmap", "gblackbox", "gsoftbin"])
def test_a_dropped_keyword_is_refused_like_a_written_out_signature(name):
    with pytest.raises(TypeError, match="unexpected keyword argument 'symmetric'"):
        get_loss_class(name)(symmetric=False)


def test_keywords_reach_both_the_parent_and_the_variant():
    loss = get_loss_class("groadmap")(temperature=0.02, start=0.0, calibration_weight=2.5)
    assert (loss.temperature, loss.start, loss.calibration_weight) == (0.02, 0.0, 2.5)
    assert (loss.rho, loss.pos_margin, loss.global_ranking) == (100.0, 0.9, True)
    # The parent's keywords stay positional, in the parent's order.
    assert get_loss_class("gsupap")(0.03, 50.0).rho == 50.0
    with pytest.raises(TypeError, match="unexpected keyword argument 'temperatur'"):
        get_loss_class("roadmap")(temperatur=0.02)
    with pytest.raises(TypeError, match="too many positional arguments"):
        get_loss_class("gblackbox")(4.0, 0.02, 0.0, False)


def test_dropping_a_keyword_the_parent_does_not_take_fails_at_class_creation():
    class Parent:
        def __init__(self, a: int = 1) -> None:
            self.a = a

    with pytest.raises(TypeError, match=r"Parent takes no keyword\(s\) \['b'\]"):

        @variant_of(Parent, drop=("b",))
        class Child(Parent):
            pass


def test_own_keywords_after_the_parents():
    class Parent:
        def __init__(self, a: int = 1, b: int = 2) -> None:
            self.a, self.b = a, b

    @variant_of(Parent, drop=("b",))
    class Child(Parent):
        def __init__(self, *, c: int = 3, **rest: int) -> None:
            super().__init__(**rest)
            self.c = c

    assert (
        str(inspect.signature(Child.__init__)) == "(self, a: 'int' = 1, *, c: 'int' = 3) -> 'None'"
    )
    child = Child(5, c=7)
    assert (child.a, child.b, child.c) == (5, 2, 7)
