"""SSL views: the MoCo v3 two-crop augmentation pipelines."""

from __future__ import annotations

import pytest
from torchvision import transforms as T

from rl_gap.data.ssl import blur_kernel_size, moco_v3_augmentations


def _steps(pipeline):
    """(transform type, probability) of each step, unwrapping RandomApply."""
    out = []
    for t in pipeline.transforms:
        if isinstance(t, T.RandomApply):
            out += [(type(inner).__name__, t.p) for inner in t.transforms]
        else:
            out.append((type(t).__name__, getattr(t, "p", None)))
    return out


def test_moco_v3_view_pipelines_follow_the_recipe():
    view1, view2 = moco_v3_augmentations(224, crop_min=0.08)
    steps1, steps2 = dict(_steps(view1)), dict(_steps(view2))
    assert steps1["ColorJitter"] == steps2["ColorJitter"] == 0.8
    assert steps1["RandomGrayscale"] == steps2["RandomGrayscale"] == 0.2
    assert steps1["GaussianBlur"] == 1.0 and steps2["GaussianBlur"] == 0.1
    assert "RandomSolarize" not in steps1 and steps2["RandomSolarize"] == 0.2
    assert steps1["RandomHorizontalFlip"] == 0.5
    crop = view1.transforms[0]
    assert crop.size == (224, 224) and crop.scale == (0.08, 1.0)
    jitter = view1.transforms[1].transforms[0]
    assert (jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue) == (
        (0.6, 1.4), (0.6, 1.4), (0.8, 1.2), (-0.1, 0.1),
    )  # fmt: skip
    assert blur_kernel_size(224) == 23 and blur_kernel_size(28) == 3
    blur = view1.transforms[3].transforms[0]
    assert blur.sigma == pytest.approx((0.1, 2.0))
    small_blur = moco_v3_augmentations(28)[0].transforms[3].transforms[0]
    assert small_blur.sigma == pytest.approx((0.0125, 0.25))
    with pytest.raises(ValueError, match="crop_min"):
        moco_v3_augmentations(32, crop_min=0.0)
