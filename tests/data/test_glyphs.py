"""The glyph demo: deterministic offline rendering, captions, splits, demo recipes."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch

from rl_gap.data.glyphs import (
    DEJAVU_DIR,
    GlyphsDataModule,
    RenderSpec,
    demo_characters,
    font_paths,
    glyph_caption,
    render_glyph,
    render_set,
    render_specs,
    split_characters,
)

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "demo"
needs_fonts = pytest.mark.skipif(
    not Path(DEJAVU_DIR, "DejaVuSans.ttf").is_file(),
    reason="DejaVu fonts missing (apt-get install fonts-dejavu-core)",
)


def test_captions_are_unicode_names_and_split_is_disjoint():
    assert glyph_caption("á") == "LATIN SMALL LETTER A WITH ACUTE"
    assert glyph_caption("Ω") == "GREEK CAPITAL LETTER OMEGA"
    chars = demo_characters()
    assert len(chars) == len(set(chars)) == 301
    train, held = split_characters(8)
    assert set(train).isdisjoint(held) and sorted(train + held) == sorted(chars)
    assert len(held) == 38
    assert all(unicodedata.category(c) in ("Lu", "Ll", "Nd") for c in chars)
    with pytest.raises(ValueError, match="holdout_every"):
        split_characters(1)


def test_missing_fonts_say_what_to_install(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install fonts-dejavu-core") as err:
        font_paths(tmp_path)
    assert str(tmp_path / "DejaVuSans.ttf") in str(err.value)
    with pytest.raises(FileNotFoundError, match="DejaVuSerif-Bold.ttf"):
        GlyphsDataModule(font_dir=str(tmp_path))


@needs_fonts
def test_rendering_is_deterministic_and_draws_the_glyph():
    fonts = font_paths()
    spec = RenderSpec(str(fonts[0]), 20, 0, 0)
    a = np.asarray(render_glyph("é", spec))
    assert a.shape == (32, 32, 3) and np.array_equal(a, np.asarray(render_glyph("é", spec)))
    ink = a[..., 0] < 128
    assert 10 < ink.sum() < 400  # a glyph, not a blank or a filled box
    ys, xs = np.nonzero(ink)
    assert abs(xs.mean() - 15.5) < 4 and abs(ys.mean() - 15.5) < 6  # roughly centred
    shifted = np.asarray(render_glyph("é", RenderSpec(str(fonts[0]), 20, 2, 0)))
    xs2 = np.nonzero(shifted[..., 0] < 128)[1]
    assert xs2.mean() - xs.mean() == pytest.approx(2.0, abs=0.5)
    assert not np.array_equal(a, np.asarray(render_glyph("e", spec)))  # the accent shows
    specs = render_specs(fonts)
    assert len(specs) == 6 * 3 * 9
    images, owners = render_set(["a", "b"], 4, specs, seed=3)
    again, _ = render_set(["a", "b"], 4, specs, seed=3)
    assert owners == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(images, again))
    distinct = {np.asarray(x).tobytes() for x in images[:4]}
    assert len(distinct) == 4  # four different renderings of one character


@needs_fonts
def test_datamodule_batches_and_eval_sets():
    dm = GlyphsDataModule(batch_size=16, train_renders=2, eval_renders=1)
    dm.configure_for_model(
        lambda texts: torch.zeros(len(texts), 4, dtype=torch.long),
        32,
        (0.5, 0.5, 0.5),
        (0.5, 0.5, 0.5),
    )
    batch = next(iter(dm.train_dataloader()))
    assert batch["image"].shape == (16, 3, 32, 32) and batch["text"].shape == (16, 4)
    assert batch["image"].min() >= -1.0 and batch["image"].max() <= 1.0
    sets = dm.eval_datasets()
    roles = [(d.eval_name, d.eval_role) for d in sets]
    assert roles == [
        ("glyphs_unseen", "retrieval_images"),
        ("glyphs_unseen", "retrieval_texts"),
        ("glyphs_unseen_cls", "zero_shot"),
        ("glyphs_seen", "retrieval_images"),
        ("glyphs_seen", "retrieval_texts"),
    ]
    held = dm.heldout_chars
    assert sets[1].captions == [glyph_caption(c) for c in held]
    assert sets[2].classnames == sets[1].captions and len(sets[0]) == len(held)


@needs_fonts
@pytest.mark.parametrize(
    "loss",
    # The recipes differ only in their loss section; one stays in the fast suite.
    [
        "gsap",
        pytest.param("infonce", marks=pytest.mark.slow),
        pytest.param("siglip", marks=pytest.mark.slow),
    ],
)
def test_demo_recipe_fast_dev_run(loss, tmp_path, monkeypatch):
    """`rl-gap fit --config recipes/demo/glyphs_<loss>.yaml --trainer.fast_dev_run=true`,
    with fewer renderings so the test stays quick."""
    from rl_gap.losses import get_loss_class
    from rl_gap.training.cli import run_lightning_cli

    monkeypatch.setenv("WANDB_MODE", "disabled")
    cli = run_lightning_cli(
        [
            "fit",
            "--config",
            str(RECIPES / f"glyphs_{loss}.yaml"),
            "--trainer.fast_dev_run=true",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
            "--data.init_args.train_renders=1",
            "--data.init_args.eval_renders=1",
            "--data.init_args.eval_seen=false",
            "--data.init_args.batch_size=32",
        ]
    )
    metrics = cli.trainer.callback_metrics
    assert type(cli.model.loss_fn) is get_loss_class(loss)
    assert torch.isfinite(metrics["train/loss"])
    for key in ("i2t_gap", "t2i_gap", "i2t_map", "i2t_r@1", "t2i_r@10"):
        value = float(metrics[f"val/glyphs_unseen/{key}"])
        assert 0.0 <= value <= 1.0
    assert 0.0 <= float(metrics["val/glyphs_unseen_cls/zs_top1"]) <= 1.0
