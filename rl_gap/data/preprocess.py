"""DataModules follow the model's preprocessing (:mod:`rl_gap.models.preprocess`).

A DataModule that reads image files builds its transforms from the
:class:`~rl_gap.models.preprocess.Preprocess` of the model it feeds: timm's data
config of the backbone, open_clip's preprocess of a CLIP model. A recipe overrides
single values in the data section (``image_size``, ``mean``, ``std``,
``interpolation``, ``crop_pct``) or several at once in one ``preprocess:`` section::

    data:
      init_args:
        preprocess: {mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5], interpolation: bicubic}

``rl-gap fit|validate|test|predict`` hands the built model's values to the DataModule
before the trainer starts (:func:`adopt_model_preprocess`), prints them in one line and
records them in the run's ``config.yaml`` (``data.init_args.preprocess``). Outside the
CLI, :meth:`FollowsModelPreprocess.setup_preprocess` finds the model through the
trainer; a DataModule used with no model at all keeps its own defaults.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rl_gap.models.preprocess import (
    CONVNET_PREPROCESS,
    KEYS,
    Preprocess,
    PreprocessError,
    check_values,
    find_preprocess,
)


def recipe_values(preprocess: Mapping[str, Any] | None = None, **keys: Any) -> dict[str, Any]:
    """The values a recipe sets: single keys (None = not set) and the ``preprocess:`` section.

    A key set both ways must agree (a run's saved config repeats the single keys inside
    the section). Raises :class:`~rl_gap.models.preprocess.PreprocessError` naming a bad key
    or value.
    """
    section = dict(preprocess or {})
    check_values(section)
    single = {k: v for k, v in keys.items() if v is not None}
    check_values(single)
    for key, value in single.items():
        if key in section and _norm(section[key]) != _norm(value):
            raise PreprocessError(
                f"{key} is set twice with different values: {value!r} and preprocess.{key} "
                f"{section[key]!r}"
            )
    return {k: v for k, v in {**section, **single}.items() if v is not None}


def _norm(value: Any) -> Any:
    return tuple(float(v) for v in value) if isinstance(value, list | tuple) else value


class FollowsModelPreprocess:
    """Mixin of the DataModules that read image files: the model's preprocessing, a
    recipe's overrides on top.

    Subclasses call :meth:`init_preprocess` in ``__init__`` and read
    :attr:`preprocessing` (after :meth:`setup_preprocess`) to build transforms.
    """

    default_preprocess: Preprocess = CONVNET_PREPROCESS  # without a model
    follows_model = True  # False: in-memory data normalised once (MNIST demos)

    def init_preprocess(self, overrides: dict[str, Any], default: Preprocess | None = None) -> None:
        self.preprocess_overrides = overrides
        if default is not None:
            self.default_preprocess = default
        self._model_preprocess: Preprocess | None = None
        self._preprocessing: Preprocess | None = None

    def configure_preprocess(self, model: Preprocess | None) -> Preprocess:
        """Follow ``model``'s preprocessing (None: the DataModule's default), overrides on top."""
        if model is not None and self.follows_model:
            self._model_preprocess = model
        base = self._model_preprocess or self.default_preprocess
        self._preprocessing = base.with_values(
            self.preprocess_overrides, f"{base.source}; recipe sets {', '.join(self._set_keys())}"
        )
        return self._preprocessing

    def _set_keys(self) -> list[str]:
        return [k for k in KEYS if k in self.preprocess_overrides]

    def setup_preprocess(self) -> Preprocess:
        """The preprocessing in use: as configured, else the attached trainer's model's."""
        if self._preprocessing is None:
            trainer = getattr(self, "_trainer", None) or getattr(self, "trainer", None)
            model = getattr(trainer, "lightning_module", None) if trainer is not None else None
            self.configure_preprocess(find_preprocess(model))
        assert self._preprocessing is not None
        return self._preprocessing

    @property
    def preprocessing(self) -> Preprocess:
        """The resolved :class:`~rl_gap.models.preprocess.Preprocess` (see :meth:`setup_preprocess`)."""
        return self.setup_preprocess()


def adopt_model_preprocess(datamodule: Any, model: Any) -> Preprocess | None:
    """Hand ``model``'s preprocessing to ``datamodule``; the values in use, or None when the
    DataModule does not follow a model (custom ones, in-memory demos)."""
    if not isinstance(datamodule, FollowsModelPreprocess) or not datamodule.follows_model:
        return None
    return datamodule.configure_preprocess(find_preprocess(model))


def follow_model_preprocess(model: Any, *datasets: Any, quiet: bool = False) -> Preprocess | None:
    """Rebuild the evaluation transform of ``datasets`` for ``model`` (``rl-gap knn`` and
    ``linear-probe`` load the checkpoint after the recipe's DataModule built its datasets).

    A dataset made by a DataModule that follows the model carries it as ``preprocess_owner``;
    the owner's recipe overrides still win. Prints the values in use; returns them (None when
    no dataset follows a model). ``quiet``: nothing printed (``--quiet``).
    """
    import sys

    found, used = find_preprocess(model), None
    for dataset in datasets:
        owner = getattr(dataset, "preprocess_owner", None)
        if owner is None or not owner.follows_model:
            continue
        used = owner.configure_preprocess(found)
        dataset.transform = eval_transform(used)
    if used is not None and not quiet:
        print(used.describe(), file=sys.stderr)
    return used


# ------------------------------------------------------------------ transforms
def _mode(name: str):
    from torchvision.transforms import InterpolationMode

    return InterpolationMode(name)


def eval_transform(pp: Preprocess):
    """timm's evaluation transform: shorter side to ``floor(size / crop_pct)``, centre crop
    ``size`` (``resize_mode: squash`` resizes both sides to ``size``), tensor, normalise."""
    from torchvision import transforms as T

    if pp.resize_mode == "squash":
        resize = [T.Resize((pp.image_size, pp.image_size), interpolation=_mode(pp.interpolation))]
    else:
        scale = math.floor(pp.image_size / pp.crop_pct)
        resize = [
            T.Resize(scale, interpolation=_mode(pp.interpolation)),
            T.CenterCrop(pp.image_size),
        ]
    return T.Compose([*resize, T.ToTensor(), T.Normalize(pp.mean, pp.std)])


def train_transform(pp: Preprocess, scale: tuple[float, float] = (0.16, 1.0)):
    """Random-resized crop (area fraction in ``scale``) + horizontal flip, with the model's
    interpolation and normalisation."""
    from torchvision import transforms as T

    return T.Compose(
        [
            T.RandomResizedCrop(pp.image_size, scale=scale, interpolation=_mode(pp.interpolation)),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(pp.mean, pp.std),
        ]
    )
