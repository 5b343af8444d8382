"""The bundled CLIP demo: glyph images captioned with their Unicode names.

Characters (digits, Latin with diacritics, Greek) are rendered offline from
the six DejaVu core fonts at several sizes and offsets; the caption is the
character's Unicode name (``"LATIN SMALL LETTER A WITH ACUTE"``). Everything
is deterministic and needs no download. A fixed subset of characters (every
``holdout_every``-th code point) never appears in training: retrieval and
zero-shot classification on them test whether the towers learnt the
*compositional* names (``... E WITH CARON`` after seeing ``C WITH CARON`` and
``E WITH ACUTE``).

Captions of one character form a caption group: every rendering of a
character is relevant to its name, so a training batch's relevance matrix
has several positives per row whenever a character repeats.
"""

from __future__ import annotations

import itertools
import random
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont
from torch.utils.data import Dataset

from rl_gap.data.image_text import CLIPDataModuleBase, RetrievalImages, RetrievalTexts, Transform
from rl_gap.data.zero_shot import InMemoryClassification

DEJAVU_DIR = "/usr/share/fonts/truetype/dejavu"
# The fonts of Debian/Ubuntu's ``fonts-dejavu-core`` package.
DEJAVU_CORE_FONTS = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
)
# Code-point ranges of the demo alphabet: digits, ASCII letters, Latin-1 and
# Latin Extended-A letters, Greek capital and small letters.
CHARACTER_RANGES = (
    (0x30, 0x39),
    (0x41, 0x5A),
    (0x61, 0x7A),
    (0xC0, 0xFF),
    (0x100, 0x17F),
    (0x391, 0x3A9),
    (0x3B1, 0x3C9),
)


def font_paths(font_dir: str | Path = DEJAVU_DIR) -> list[Path]:
    """The six DejaVu core font files, or a FileNotFoundError saying how to install them."""
    font_dir = Path(font_dir)
    paths = [font_dir / name for name in DEJAVU_CORE_FONTS]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"the glyph demo needs the DejaVu core fonts; missing: {', '.join(missing)}. "
            "Install them with `apt-get install fonts-dejavu-core` (Debian/Ubuntu) or pass "
            "font_dir= a folder holding " + ", ".join(DEJAVU_CORE_FONTS)
        )
    return paths


def demo_characters() -> list[str]:
    """The demo alphabet: letters and digits of ``CHARACTER_RANGES`` that have a name."""
    chars = []
    for lo, hi in CHARACTER_RANGES:
        for code in range(lo, hi + 1):
            ch = chr(code)
            if unicodedata.category(ch) in ("Lu", "Ll", "Nd") and unicodedata.name(ch, ""):
                chars.append(ch)
    return chars


def split_characters(holdout_every: int = 8) -> tuple[list[str], list[str]]:
    """(training characters, held-out characters): every ``holdout_every``-th is held out."""
    if holdout_every < 2:
        raise ValueError(f"holdout_every must be ≥ 2, got {holdout_every}")
    chars = demo_characters()
    held = chars[holdout_every // 2 :: holdout_every]
    held_set = set(held)
    return [c for c in chars if c not in held_set], held


@dataclass(frozen=True)
class RenderSpec:
    """One rendering: font file, point size and offset of the glyph centre (pixels)."""

    font: str
    size: int
    dx: int
    dy: int


@lru_cache(maxsize=64)
def _font(path: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, size)


def render_glyph(ch: str, spec: RenderSpec, canvas: int = 32) -> Image.Image:
    """Black glyph on a white ``canvas``² RGB image, centred then shifted by (dx, dy)."""
    img = Image.new("L", (canvas, canvas), color=255)
    draw = ImageDraw.Draw(img)
    centre = (canvas / 2 + spec.dx, canvas / 2 + spec.dy)
    draw.text(centre, ch, font=_font(spec.font, spec.size), fill=0, anchor="mm")
    return img.convert("RGB")


def render_specs(
    fonts: Sequence[Path], canvas: int = 32, sizes: Sequence[int] | None = None
) -> list[RenderSpec]:
    """All (font, size, offset) combinations the demo draws from."""
    sizes = sizes or (round(canvas * 0.55), round(canvas * 0.65), round(canvas * 0.75))
    shift = max(1, canvas // 16)
    offsets = (-shift, 0, shift)
    return [
        RenderSpec(str(f), int(s), dx, dy)
        for f, s, dx, dy in itertools.product(fonts, sizes, offsets, offsets)
    ]


def render_set(
    chars: Sequence[str],
    renders_per_char: int,
    specs: Sequence[RenderSpec],
    seed: int,
    canvas: int = 32,
) -> tuple[list[Image.Image], list[int]]:
    """``renders_per_char`` distinct renderings per character, drawn with ``seed``.

    Returns (images, character index of each image).
    """
    if renders_per_char > len(specs):
        raise ValueError(f"renders_per_char={renders_per_char} exceeds the {len(specs)} specs")
    rng = random.Random(seed)
    images, owners = [], []
    for i, ch in enumerate(chars):
        for spec in rng.sample(list(specs), renders_per_char):
            images.append(render_glyph(ch, spec, canvas))
            owners.append(i)
    return images, owners


def glyph_caption(ch: str) -> str:
    """The caption of a glyph: its Unicode name."""
    return unicodedata.name(ch)


class GlyphPairs(Dataset):
    """Training pairs (rendering, Unicode name); group = character index."""

    def __init__(
        self,
        images: Sequence[Image.Image],
        owners: Sequence[int],
        captions: Sequence[str],
        transform,
    ) -> None:
        self.images, self.owners, self.captions = list(images), list(owners), list(captions)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict[str, Any]:
        owner = self.owners[i]
        return {
            "image": self.transform(self.images[i]),
            "text": self.captions[owner],
            "group": owner,
        }


class GlyphsDataModule(CLIPDataModuleBase):
    """The glyph demo as a DataModule (see module doc).

    Args:
        font_dir: folder of the DejaVu core fonts.
        canvas: rendered image side in pixels (resized to the model's size).
        train_renders: renderings per training character.
        eval_renders: renderings per character in the evaluation sets.
        holdout_every: every n-th character is held out of training.
        eval_seen: also evaluate retrieval on new renderings of the training
            characters (``glyphs_seen``), next to the held-out ``glyphs_unseen``.
        seed: rendering draws (evaluation uses ``seed + 1``).
        (batching and preprocessing: see ``CLIPDataModuleBase``)
    """

    def __init__(
        self,
        font_dir: str = DEJAVU_DIR,
        canvas: int = 32,
        train_renders: int = 8,
        eval_renders: int = 3,
        holdout_every: int = 8,
        eval_seen: bool = True,
        seed: int = 0,
        batch_size: int = 128,
        eval_batch_size: int | None = 256,
        num_workers: int = 0,
        image_size: int | None = None,
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        tokenizer: str | None = None,
    ) -> None:
        super().__init__(batch_size, eval_batch_size, num_workers, image_size, mean, std, tokenizer)
        self.fonts = font_paths(font_dir)  # fail at construction, naming the missing files
        self.canvas, self.seed = int(canvas), int(seed)
        self.train_renders, self.eval_renders = int(train_renders), int(eval_renders)
        self.eval_seen = eval_seen
        self.train_chars, self.heldout_chars = split_characters(holdout_every)
        self.specs = render_specs(self.fonts, self.canvas)

    def image_transform(self, train: bool) -> Transform:
        """Tensor + normalisation (+ resize when the model's size differs from the canvas)."""
        from torchvision import transforms as T

        size, mean, std = self._preprocess()
        steps: list[Any] = []
        if size != self.canvas:
            steps.append(T.Resize(size, interpolation=T.InterpolationMode.BICUBIC))
        steps += [T.ToTensor(), T.Normalize(mean, std)]
        return T.Compose(steps)

    def train_dataset(self) -> Dataset:
        images, owners = render_set(
            self.train_chars, self.train_renders, self.specs, self.seed, self.canvas
        )
        captions = [glyph_caption(c) for c in self.train_chars]
        return GlyphPairs(images, owners, captions, self.image_transform(train=True))

    def eval_datasets(self) -> list[Dataset]:
        transform = self.image_transform(train=False)
        sets: list[Dataset] = []
        groups = [("glyphs_unseen", self.heldout_chars)]
        if self.eval_seen:
            groups.append(("glyphs_seen", self.train_chars))
        for name, chars in groups:
            images, owners = render_set(
                chars, self.eval_renders, self.specs, self.seed + 1, self.canvas
            )
            captions = [glyph_caption(c) for c in chars]
            sets.append(RetrievalImages(images, owners, transform, name))
            sets.append(RetrievalTexts(captions, list(range(len(chars))), name))
            if name == "glyphs_unseen":
                sets.append(
                    InMemoryClassification(
                        images, owners, captions, "identity", transform, name="glyphs_unseen_cls"
                    )
                )
        return sets
