"""The preprocessing a backbone expects, as its own library states it.

A pretrained backbone was trained on images resized, cropped and normalised in one
particular way; feeding it differently normalised pixels silently costs accuracy.
Every encoder of this package therefore carries a :class:`Preprocess`:

- timm backbones (:class:`~rl_gap.models.EmbeddingEncoder`, MoCo v3): timm's data
  config of the built model, ``timm.data.resolve_model_data_config`` (mean, std,
  interpolation, crop_pct, input size), e.g. mean/std 0.5, bicubic, crop 0.9 for
  ``vit_base_patch16_224.augreg2_in21k_ft_in1k``;
- open_clip models (:class:`~rl_gap.models.CLIPEncoder`): open_clip's own
  ``PreprocessCfg`` of the architecture, overlaid with the pretrained tag's registry
  entry (mean, std, interpolation, resize mode), as ``open_clip.create_model_and_transforms``
  builds it;
- the project's small CPU convnet (``rl_gap_convnet``) states the ImageNet values it
  has always used (:data:`CONVNET_PREPROCESS`).

The DataModules build their transforms from it (:mod:`rl_gap.data.preprocess`); a
recipe can override any value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# torchvision's InterpolationMode values (PIL filters) that a transform can be built with
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "box", "hamming", "lanczos")
RESIZE_MODES = ("shortest", "longest", "squash")  # open_clip's eval resize modes
KEYS = ("image_size", "mean", "std", "interpolation", "crop_pct", "resize_mode")


class PreprocessError(ValueError):
    """A preprocessing value that no transform can be built from (one line naming it)."""


@dataclass(frozen=True)
class Preprocess:
    """How images are turned into the tensors a backbone expects.

    Attributes:
        image_size: side of the square crop fed to the model.
        mean, std: per-channel normalisation of [0, 1] pixels.
        interpolation: resize filter (``bilinear``, ``bicubic``, ...).
        crop_pct: evaluation resizes the shorter side to ``image_size / crop_pct``,
            then centre-crops ``image_size`` (timm's convention; 1.0 = no border cut).
        resize_mode: open_clip's evaluation resize: ``shortest`` (resize the shorter
            side, centre crop), ``longest`` (pad) or ``squash`` (resize both sides).
        source: where the values came from (printed; not a setting).
    """

    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bilinear"
    crop_pct: float = 0.875
    resize_mode: str = "shortest"
    source: str = ""

    def __post_init__(self) -> None:
        check_values(asdict(self))

    def settings(self) -> dict[str, Any]:
        """The values as a recipe's ``preprocess:`` section writes them (lists, no source)."""
        out = asdict(self)
        out.pop("source")
        out["mean"], out["std"] = list(self.mean), list(self.std)
        return out

    def with_values(self, values: Mapping[str, Any], source: str) -> Preprocess:
        """A copy with ``values`` (a subset of :data:`KEYS`) replaced."""
        if not values:
            return self
        check_values(values)
        changed = {k: _typed(k, v) for k, v in values.items()}
        return replace(self, **changed, source=source)

    def describe(self) -> str:
        """One line: every value and where it came from."""
        mean = ", ".join(f"{m:.4g}" for m in self.mean)
        std = ", ".join(f"{s:.4g}" for s in self.std)
        resize = f", resize {self.resize_mode}" if self.resize_mode != "shortest" else ""
        return (
            f"preprocessing: {self.image_size}px, mean ({mean}), std ({std}), "
            f"{self.interpolation}, crop_pct {self.crop_pct:g}{resize} ({self.source})"
        )


def _typed(key: str, value: Any) -> Any:
    if key in ("mean", "std"):
        return tuple(float(v) for v in value)
    if key == "image_size":
        return int(value)
    if key == "crop_pct":
        return float(value)
    return value


def check_values(values: Mapping[str, Any]) -> None:
    """Raise :class:`PreprocessError` naming the first unusable value of ``values``."""
    for key, value in values.items():
        if key == "source" or value is None:
            continue
        if key not in KEYS:
            raise PreprocessError(
                f"unknown preprocessing key {key!r}; the keys are {', '.join(KEYS)}"
            )
        if key == "image_size" and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise PreprocessError(f"image_size must be a positive integer, got {value!r}")
        if key in ("mean", "std"):
            if (
                isinstance(value, str | bytes)
                or not isinstance(value, Sequence)
                or not value
                or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
            ):
                raise PreprocessError(
                    f"{key} must be a list of numbers (one per channel), got {value!r}"
                )
            if key == "std" and any(v <= 0 for v in value):
                raise PreprocessError(f"std must be > 0 for every channel, got {list(value)}")
        if key == "interpolation" and value not in INTERPOLATIONS:
            raise PreprocessError(
                f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got {value!r}"
            )
        if key == "resize_mode" and value not in RESIZE_MODES:
            raise PreprocessError(
                f"resize_mode must be one of {', '.join(RESIZE_MODES)}, got {value!r}"
            )
        if key == "crop_pct" and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1
        ):
            raise PreprocessError(f"crop_pct must lie in (0, 1], got {value!r}")


# What the DataModules did before they asked the model, kept for the project's own convnet
# and for a DataModule used without a model: ImageNet statistics, bilinear, 256 -> 224.
CONVNET_PREPROCESS = Preprocess(
    224, IMAGENET_MEAN, IMAGENET_STD, "bilinear", 0.875, source="ImageNet defaults"
)


def timm_preprocess(model: Any, name: str) -> Preprocess:
    """timm's data config of a built timm model (``resolve_model_data_config``).

    Args:
        model: a model made by ``timm.create_model`` (its ``pretrained_cfg`` is read).
        name: the backbone name, for the ``source`` line.
    """
    from timm.data import resolve_model_data_config

    config = resolve_model_data_config(model)
    height, width = config["input_size"][-2:]
    built = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if built is not None and getattr(model.patch_embed, "strict_img_size", True):
        # a ViT built for another size (img_size=32) takes only that size; timm's
        # config still states the pretrained one
        height, width = (built, built) if isinstance(built, int) else tuple(built)
    if height != width:
        raise PreprocessError(
            f"timm's data config of {name!r} has a non-square input {height}x{width}; "
            "set image_size in the data section"
        )
    return Preprocess(
        image_size=int(height),
        mean=tuple(float(m) for m in config["mean"]),
        std=tuple(float(s) for s in config["std"]),
        interpolation=str(config["interpolation"]),
        crop_pct=float(config["crop_pct"]),
        source=f"timm's data config of {name}",
    )


def open_clip_preprocess(config: Mapping[str, Any], name: str) -> Preprocess:
    """open_clip's preprocessing from a ``PreprocessCfg``-keyed mapping (``size``, ``mean``,
    ``std``, ``interpolation``, ``resize_mode``); open_clip's evaluation crop keeps the
    whole resized side (``crop_pct`` 1)."""
    size = config["size"]
    if isinstance(size, Sequence):
        if len(set(size)) != 1:
            raise PreprocessError(f"open_clip model {name!r} has a non-square input {size}")
        size = size[0]
    return Preprocess(
        image_size=int(size),
        mean=tuple(float(m) for m in config["mean"]),
        std=tuple(float(s) for s in config["std"]),
        interpolation=str(config["interpolation"]),
        crop_pct=1.0,
        resize_mode=str(config.get("resize_mode", "shortest")),
        source=f"open_clip's preprocess config of {name}",
    )


def find_preprocess(model: Any) -> Preprocess | None:
    """The :class:`Preprocess` of the first encoder inside ``model`` (a LightningModule or
    any ``nn.Module``), or None when it holds none."""
    if model is None:
        return None
    own = getattr(model, "preprocess", None)
    if isinstance(own, Preprocess):
        return own
    modules = getattr(model, "modules", None)
    if modules is None:
        return None
    for sub in modules():
        found = getattr(sub, "preprocess", None)
        if isinstance(found, Preprocess):
            return found
    return None
