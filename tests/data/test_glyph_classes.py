"""Glyph identity as a class-disjoint metric-learning task (``rl_gap.data.glyph_classes``).

Checked as sets (the split), as pixels (ink on white, distinct renderings) and as batch
orders compared across seeds (the data fixed, the order seeded).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rl_gap.data.glyph_classes import GlyphClassesDataModule, render_classes, split_alphabet
from rl_gap.data.glyphs import DEJAVU_DIR, demo_characters

needs_fonts = pytest.mark.skipif(
    not Path(DEJAVU_DIR, "DejaVuSans.ttf").is_file(),
    reason="DejaVu fonts missing (apt-get install fonts-dejavu-core)",
)


def test_split_is_disjoint_seeded_and_sized():
    train, test = split_alphabet(150, 150, 0)
    assert len(train) == len(set(train)) == 150 and len(test) == len(set(test)) == 150
    assert set(train).isdisjoint(test) and set(train) | set(test) <= set(demo_characters())
    assert split_alphabet(150, 150, 0) == (train, test)
    other = split_alphabet(150, 150, 1)
    assert other != (train, test) and set(other[0]).isdisjoint(other[1])
    small = split_alphabet(40, 100, 3)
    assert (len(small[0]), len(small[1])) == (40, 100)


@pytest.mark.parametrize(
    ("train", "test", "match"),
    [(1, 10, ">= 2"), (10, 1, ">= 2"), (200, 200, "exceeds the 301 characters")],
)
def test_split_refuses_bad_counts(train, test, match):
    with pytest.raises(ValueError, match=match):
        split_alphabet(train, test, 0)


@needs_fonts
def test_renderings_are_distinct_glyph_images_grouped_by_character():
    images, labels = render_classes("aé", 4, 32, 0, DEJAVU_DIR)
    assert images.shape == (8, 32, 32) and images.dtype == np.uint8
    assert labels.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    # four distinct renderings of one character, each with ink (dark pixels) on white
    assert len({im.tobytes() for im in images[:4]}) == 4
    assert all((im < 128).sum() > 10 and im.max() == 255 for im in images)
    # same seed, same images; another seed, other draws
    again, _ = render_classes("aé", 4, 32, 0, DEJAVU_DIR)
    assert np.array_equal(images, again)
    other, _ = render_classes("aé", 4, 32, 5, DEJAVU_DIR)
    assert not np.array_equal(images, other)
    with pytest.raises(ValueError, match="renders must be in"):
        render_classes("a", 1000, 32, 0, DEJAVU_DIR)


@needs_fonts
def test_datamodule_splits_data_fixed_and_batch_order_seeded():
    kw = dict(train_classes=12, test_classes=6, train_renders=4, test_renders=3, canvas=16,
              batch_size=16, m_per_class=4, batches_per_epoch=5)  # fmt: skip
    a, b = GlyphClassesDataModule(seed=0, **kw), GlyphClassesDataModule(seed=1, **kw)
    for dm in (a, b):
        dm.setup("fit")
    train, test = a.datasets["train"], a.datasets["test"]
    assert len(train) == 48 and len(test) == 18 and train.images.shape[1:] == (1, 16, 16)
    assert torch.bincount(train.labels).tolist() == [4] * 12
    assert torch.bincount(test.labels).tolist() == [3] * 6
    assert a.datasets["val"] is test  # val_split 0: validation is the test split
    # the data do not depend on the seed; the batch order does
    assert torch.equal(train.images, b.datasets["train"].images)
    order_a, order_b = (
        list(a.train_dataloader().batch_sampler),
        list(b.train_dataloader().batch_sampler),
    )
    assert len(order_a) == 5 and order_a != order_b
    for batch in order_a:  # 4 characters x 4 renderings per batch
        assert sorted(torch.bincount(train.labels[batch]).tolist())[-4:] == [4, 4, 4, 4]
    # a held-out share of the training characters for validation
    held = GlyphClassesDataModule(val_split=0.25, **kw)
    held.setup("fit")
    val_classes = set(held.datasets["val"].labels.tolist())
    assert len(val_classes) == 3
    assert val_classes.isdisjoint(held.datasets["train"].labels.tolist())


@needs_fonts
def test_bad_settings_are_one_line_errors():
    with pytest.raises(ValueError, match="train_renders and test_renders must be >= 2"):
        GlyphClassesDataModule(train_renders=1)
    with pytest.raises(ValueError, match="canvas must be >= 8"):
        GlyphClassesDataModule(canvas=4)
    with pytest.raises(FileNotFoundError, match="DejaVu core fonts"):
        GlyphClassesDataModule(font_dir="/nonexistent")


def test_glyphs_keep_their_own_normalisation_whatever_the_model():
    """In-memory glyphs are normalised once, (x / 255 - 0.9) / 0.25: a backbone's data config
    (ImageNet mean/std for rl_gap_convnet) is neither applied nor announced."""
    from rl_gap.data.preprocess import adopt_model_preprocess
    from rl_gap.modules import MetricLearningModule

    dm = GlyphClassesDataModule(train_classes=6, test_classes=3, train_renders=2, test_renders=2,
                                canvas=16, batch_size=8, m_per_class=2)  # fmt: skip
    model = MetricLearningModule(backbone="rl_gap_convnet", backbone_kwargs={"width": 4},
                                 in_chans=1, dim=8, eval_plots=False)  # fmt: skip
    assert adopt_model_preprocess(dm, model) is None
    dm.setup("fit")
    pixels = dm.datasets["train"].images
    # white canvas and black ink, mapped by the glyphs' own statistics
    assert pixels.max().item() == pytest.approx((1 - 0.9) / 0.25, abs=1e-6)
    assert pixels.min().item() == pytest.approx((0 - 0.9) / 0.25, abs=1e-6)
