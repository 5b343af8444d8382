"""Each encoder carries the preprocessing its own library states for it (no weights needed)."""

from __future__ import annotations

import open_clip
import pytest
import timm

from rl_gap.models.clip import CLIPEncoder, tiny_clip_config
from rl_gap.models.encoder import EmbeddingEncoder
from rl_gap.models.moco import create_backbone
from rl_gap.models.preprocess import Preprocess, PreprocessError, find_preprocess
from rl_gap.models.pretrained import weights_from_checkpoint

# timm names whose pretrained configs differ in every value the DataModules use
TIMM_CASES = {
    # name: (mean, interpolation, crop_pct) as timm's pretrained_cfg states them
    "vit_base_patch16_224.augreg2_in21k_ft_in1k": ((0.5, 0.5, 0.5), "bicubic", 0.9),
    "resnet50.tv_in1k": ((0.485, 0.456, 0.406), "bilinear", 0.875),
    "resnet50.a1_in1k": ((0.485, 0.456, 0.406), "bicubic", 0.95),
}


@pytest.mark.parametrize("name", sorted(TIMM_CASES))
def test_timm_backbone_states_timms_data_config(name):
    small = {"depth": 1} if name.startswith("vit") else {}
    encoder = EmbeddingEncoder(name, dim=0, pretrained=False, backbone_kwargs=small)
    stated = timm.models.get_pretrained_cfg(name)  # timm's registry entry of the tag
    pp = encoder.preprocess
    assert pp.mean == tuple(stated.mean) and pp.std == tuple(stated.std)
    assert pp.interpolation == stated.interpolation and pp.crop_pct == stated.crop_pct
    assert pp.image_size == stated.input_size[-1] == 224
    mean, interpolation, crop_pct = TIMM_CASES[name]  # the values written down by hand
    assert pp.mean == pytest.approx(mean) and pp.interpolation == interpolation
    assert pp.crop_pct == pytest.approx(crop_pct)
    assert name in pp.source


def test_own_convnet_keeps_imagenet_bilinear_explicitly():
    # timm's default for a config-less model would be bicubic: the convnet states bilinear
    pp = EmbeddingEncoder("rl_gap_convnet", dim=8).preprocess
    assert pp.mean == (0.485, 0.456, 0.406) and pp.std == (0.229, 0.224, 0.225)
    assert (pp.interpolation, pp.crop_pct, pp.image_size) == ("bilinear", 0.875, 224)


def test_moco_backbone_uses_built_input_size():
    net, _ = create_backbone("vit_small_patch16_224", img_size=32, patch_size=8, depth=1)
    pp = find_preprocess(net)
    stated = timm.models.get_pretrained_cfg("vit_small_patch16_224.augreg_in21k_ft_in1k")
    assert pp.image_size == 32  # the ViT only accepts the size it was built for
    assert pp.mean == tuple(stated.mean) == (0.5, 0.5, 0.5) and pp.crop_pct == stated.crop_pct


# open_clip tags whose registry entries differ (mean, interpolation, resize mode)
CLIP_CASES = [
    ("ViT-B-32", "openai", "shortest"),
    ("ViT-L-14", "laion2b_s32b_b82k", "shortest"),
    ("ViT-H-14", "dfn5b", "squash"),
    ("PE-Core-T-16-384", "meta", "squash"),
]


@pytest.mark.parametrize(("model", "tag", "resize_mode"), CLIP_CASES)
def test_clip_follows_open_clip_registry(model, tag, resize_mode):
    entry = open_clip.get_pretrained_cfg(model, tag)
    config = {**tiny_clip_config(), "quick_gelu": bool(entry.get("quick_gelu", False))}
    with weights_from_checkpoint():  # the registry entry alone, no download
        pp = CLIPEncoder(model, config, pretrained=tag).preprocess
    assert pp.mean == tuple(entry["mean"]) and pp.std == tuple(entry["std"])
    assert pp.interpolation == entry.get("interpolation", "bicubic")
    assert pp.resize_mode == resize_mode == entry.get("resize_mode", "shortest")
    assert pp.image_size == 32 and pp.crop_pct == 1.0


def test_clip_without_tag_gets_open_clip_defaults():
    pp = CLIPEncoder(None, tiny_clip_config()).preprocess
    assert pp.mean == open_clip.OPENAI_DATASET_MEAN and pp.interpolation == "bicubic"


@pytest.mark.parametrize(
    ("values", "word"),
    [
        ({"interpolation": "cubic"}, "interpolation"),
        ({"crop_pct": 1.5}, "crop_pct"),
        ({"std": [0.5, 0.0, 0.5]}, "std"),
        ({"mean": "0.5"}, "mean"),
        ({"image_size": 0}, "image_size"),
    ],
)
def test_bad_values_are_one_line(values, word):
    base = EmbeddingEncoder("rl_gap_convnet", dim=8).preprocess
    with pytest.raises(PreprocessError, match=word) as err:
        base.with_values(values, "recipe")
    assert "\n" not in str(err.value)


def test_settings_round_trip():
    pp = Preprocess(160, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), "bicubic", 0.9, source="x")
    again = Preprocess(**{**pp.settings(), "source": "y"})
    assert again.settings() == pp.settings()
