"""A many-class, class-disjoint metric-learning task rendered offline: glyph identity.

The characters of the bundled glyph alphabet (:func:`rl_gap.data.glyphs.demo_characters`:
digits, Latin with diacritics, Greek; about 300) are split once into training and
test *classes*; every image is one rendering of a character (a DejaVu core font, a
point size, a small offset: :func:`rl_gap.data.glyphs.render_specs`), grey on a
``canvas``² image. Relevance is "same character". The test characters never appear
in training, so evaluation asks the embedding to separate unseen classes, with many
of them (``é`` vs ``è`` vs ``ê``) differing by a diacritic: the setting where
one threshold for every query (gAP) and a per-query ranking (mAP) part ways.

The images depend only on ``split_seed`` and ``render_seed`` (never on ``seed``), so
runs with different seeds see the same data; ``seed`` drives batch order and the
validation split of the training classes (``val_split``), as in every
:class:`~rl_gap.data.metric_learning.MetricLearningDataModule`.
No download, no augmentation: runs are bit-reproducible.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from rl_gap.data.glyphs import DEJAVU_DIR, demo_characters, font_paths, render_glyph, render_specs
from rl_gap.data.metric_learning import InMemoryDataModule
from rl_gap.data.ml_datasets import TensorImageDataset


def split_alphabet(train_classes: int, test_classes: int, split_seed: int) -> tuple[str, str]:
    """(training characters, test characters), disjoint, drawn from a seeded permutation.

    Args:
        train_classes: number of training characters.
        test_classes: number of test characters (None-like 0 is refused).
        split_seed: seed of the permutation of the alphabet.

    Returns:
        Two strings of characters, each in alphabet order.
    """
    alphabet = demo_characters()
    if train_classes < 2 or test_classes < 2:
        raise ValueError(
            f"train_classes and test_classes must be >= 2, got {train_classes} and {test_classes}"
        )
    if train_classes + test_classes > len(alphabet):
        raise ValueError(
            f"train_classes + test_classes = {train_classes + test_classes} exceeds the "
            f"{len(alphabet)} characters of the glyph alphabet"
        )
    order = list(range(len(alphabet)))
    random.Random(split_seed).shuffle(order)
    train = sorted(order[:train_classes])
    test = sorted(order[train_classes : train_classes + test_classes])
    return "".join(alphabet[i] for i in train), "".join(alphabet[i] for i in test)


@lru_cache(maxsize=8)
def render_classes(
    chars: str, renders: int, canvas: int, seed: int, font_dir: str
) -> tuple[np.ndarray, np.ndarray]:
    """``renders`` distinct renderings of every character, drawn with ``seed``.

    Returns:
        images: (len(chars) * renders, canvas, canvas) uint8, black glyph on white;
        labels: (len(chars) * renders,) int64 position of the character in ``chars``.
    """
    specs = render_specs(font_paths(font_dir), canvas)
    if not 1 <= renders <= len(specs):
        raise ValueError(
            f"renders must be in [1, {len(specs)}] (distinct renderings), got {renders}"
        )
    rng = random.Random(seed)
    images = np.empty((len(chars) * renders, canvas, canvas), dtype=np.uint8)
    labels = np.repeat(np.arange(len(chars), dtype=np.int64), renders)
    k = 0
    for ch in chars:
        for spec in rng.sample(specs, renders):
            images[k] = np.asarray(render_glyph(ch, spec, canvas).convert("L"))
            k += 1
    return images, labels


class GlyphClassesDataModule(InMemoryDataModule):
    """Glyph identity as a class-disjoint metric-learning task (see module doc).

    Args:
        train_classes: training characters (default 150).
        test_classes: unseen test characters (default 150).
        train_renders: renderings per training character (default 16).
        test_renders: renderings per test character (default 8); every test image is a
            leave-one-out query against the other test images.
        canvas: image side in pixels.
        split_seed: seed of the train/test split of the alphabet.
        render_seed: seed of the renderings drawn per character (test: ``render_seed + 1``).
        font_dir: folder holding the DejaVu core fonts.
        batch_size, m_per_class, eval_batch_size: as in
            :class:`~rl_gap.data.metric_learning.MetricLearningDataModule`.
        **kwargs: ``num_workers``, ``val_split``, ``queries_per_class``,
            ``batches_per_epoch``, ``seed``: as in
            :class:`~rl_gap.data.metric_learning.MetricLearningDataModule`.
    """

    MEAN, STD = 0.9, 0.25  # white canvas, thin black strokes: inputs near zero mean, unit scale

    def __init__(
        self,
        train_classes: int = 150,
        test_classes: int = 150,
        train_renders: int = 16,
        test_renders: int = 8,
        canvas: int = 32,
        split_seed: int = 0,
        render_seed: int = 0,
        font_dir: str = DEJAVU_DIR,
        batch_size: int = 128,
        m_per_class: int = 4,
        eval_batch_size: int = 512,
        **kwargs: Any,
    ) -> None:
        super().__init__(  # the full alphabet split: no scarce-data subset
            image_size=canvas,
            batch_size=batch_size,
            m_per_class=m_per_class,
            eval_batch_size=eval_batch_size,
            class_fraction=1.0,
            images_per_class=None,
            **kwargs,
        )
        if canvas < 8:
            raise ValueError(f"canvas must be >= 8 pixels, got {canvas}")
        if train_renders < 2 or test_renders < 2:
            raise ValueError(
                "train_renders and test_renders must be >= 2 (a class needs a positive pair), "
                f"got {train_renders} and {test_renders}"
            )
        font_paths(font_dir)  # fail at construction, naming the missing fonts
        self.chars = dict(zip(("train", "test"), split_alphabet(train_classes, test_classes, split_seed)))  # fmt: skip
        self.renders = {"train": int(train_renders), "test": int(test_renders)}
        self.render_seeds = {"train": int(render_seed), "test": int(render_seed) + 1}
        self.canvas, self.font_dir = int(canvas), str(font_dir)

    def build_split(self, split: str, train: bool) -> Dataset:
        images, labels = render_classes(
            self.chars[split], self.renders[split], self.canvas, self.render_seeds[split],
            self.font_dir,
        )  # fmt: skip
        return TensorImageDataset(self.normalise(images)[:, None], torch.from_numpy(labels))
