"""DataModules feed each model what its library's own transforms would."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from rl_gap.data.image_text import ImageTextDataModule
from rl_gap.data.metric_learning import ImageFolderDataModule
from rl_gap.data.preprocess import eval_transform
from rl_gap.data.ssl_imagefolder import ImageFolderSSLDataModule
from rl_gap.models.clip import CLIPEncoder, tiny_clip_config
from rl_gap.models.encoder import EmbeddingEncoder
from rl_gap.models.moco import create_backbone
from rl_gap.models.preprocess import PreprocessError, find_preprocess
from rl_gap.models.pretrained import weights_from_checkpoint

VIT = "vit_base_patch16_224.augreg2_in21k_ft_in1k"  # mean/std 0.5, bicubic, crop 0.9


def _folder(root, classes=("a", "b"), per_class=2, size=(300, 260)):
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / c / f"{i}.png")
    return str(root)


def _timm_eval(model, image):
    """timm's own evaluation transform of ``model`` (the reference)."""
    import timm.data

    config = timm.data.resolve_model_data_config(model)
    return timm.data.create_transform(**config, is_training=False)(image)


def test_metric_learning_follows_timm_config_of_the_backbone(tmp_path):
    encoder = EmbeddingEncoder(VIT, dim=0, backbone_kwargs={"depth": 1})
    dm = ImageFolderDataModule(
        _folder(tmp_path / "tr"), _folder(tmp_path / "te", ("c", "d")), num_workers=0
    )
    dm.trainer = SimpleNamespace(
        lightning_module=SimpleNamespace(encoder=encoder, modules=encoder.modules)
    )
    dm.setup("fit")
    x, _, _ = dm.datasets["test"][0]
    image = Image.open(dm.datasets["test"].paths[0]).convert("RGB")
    assert torch.allclose(x, _timm_eval(encoder.backbone, image), atol=1e-6)
    pp = dm.preprocessing
    assert (pp.mean, pp.interpolation, pp.crop_pct) == ((0.5, 0.5, 0.5), "bicubic", 0.9)


def test_recipe_overrides_win_and_conflicts_are_refused(tmp_path):
    encoder = EmbeddingEncoder(VIT, dim=0, backbone_kwargs={"depth": 1})
    dm = ImageFolderDataModule(
        _folder(tmp_path / "tr"), _folder(tmp_path / "te", ("c", "d")), num_workers=0,
        mean=[0.485, 0.456, 0.406], preprocess={"std": [0.229, 0.224, 0.225], "image_size": 64},
    )  # fmt: skip
    pp = dm.configure_preprocess(encoder.preprocess)
    assert pp.mean == (0.485, 0.456, 0.406) and pp.std == (0.229, 0.224, 0.225)
    assert (pp.image_size, pp.interpolation, pp.crop_pct) == (64, "bicubic", 0.9)  # model's rest
    assert "recipe sets image_size, mean, std" in pp.source
    dm.setup("fit")
    image = Image.open(dm.datasets["test"].paths[0]).convert("RGB")
    import timm.data

    # timm's own eval transform for these values (shorter side floor(64 / 0.9) = 71, centre 64)
    reference = timm.data.create_transform(
        input_size=(3, 64, 64), interpolation="bicubic", crop_pct=0.9,
        mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), is_training=False,
    )(image)  # fmt: skip
    x = dm.datasets["test"][0][0]
    assert x.shape == (3, 64, 64) and torch.allclose(x, reference, atol=1e-6)
    with pytest.raises(PreprocessError, match="mean is set twice"):
        ImageFolderDataModule("a", "b", mean=[0.5] * 3, preprocess={"mean": [0.4] * 3})
    with pytest.raises(PreprocessError, match="unknown preprocessing key 'meen'"):
        ImageFolderDataModule("a", "b", preprocess={"meen": [0.5] * 3})


def test_without_a_model_the_old_imagenet_transform_stays():
    dm = ImageFolderDataModule("a", "b")
    pp = dm.preprocessing
    assert (pp.image_size, pp.mean, pp.interpolation, pp.crop_pct) == (
        224,
        (0.485, 0.456, 0.406),
        "bilinear",
        0.875,
    )
    resize = eval_transform(pp).transforms[0]
    assert resize.size == 256  # 224 / 0.875, as before


def test_moco_imagefolder_follows_the_backbone(tmp_path):
    net, _ = create_backbone("resnet18.a1_in1k")
    dm = ImageFolderSSLDataModule(
        _folder(tmp_path / "tr"), _folder(tmp_path / "va"), num_workers=0, pin_memory=False
    )
    dm.configure_preprocess(find_preprocess(net))
    dm.setup("fit")
    item = dm.query_set[0]
    path = dm.query_set.base.dataset.samples[0][0]
    reference = _timm_eval(net, Image.open(path).convert("RGB"))
    assert torch.allclose(item["image"], reference, atol=1e-6)
    crop = dm.train_set.view1.transforms[0]
    assert crop.interpolation.value == "bicubic" and crop.size == (224, 224)


@pytest.mark.parametrize(
    ("model", "tag"), [("ViT-H-14", "dfn5b"), ("ViT-L-14", "laion2b_s32b_b82k")]
)
def test_clip_datamodule_uses_open_clips_own_transform(tmp_path, model, tag):
    entry = open_clip.get_pretrained_cfg(model, tag)
    config = {**tiny_clip_config(), "quick_gelu": bool(entry.get("quick_gelu", False))}
    with weights_from_checkpoint():
        encoder = CLIPEncoder(model, config, pretrained=tag)
    dm = ImageTextDataModule(num_workers=0)
    dm.configure_preprocess(encoder.preprocess)
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (50, 80, 3), dtype=np.uint8))
    from open_clip.transform import PreprocessCfg, image_transform_v2, merge_preprocess_dict

    # what open_clip.create_model_and_transforms would build for this tag at 32 pixels
    cfg = merge_preprocess_dict(PreprocessCfg(size=32), entry)
    reference = image_transform_v2(PreprocessCfg(**cfg), is_train=False)(image)
    assert torch.allclose(dm.image_transform(train=False)(image), reference)
    assert dm.image_size == 32 and dm.mean == tuple(entry["mean"])


def test_clip_refuses_crop_pct():
    with pytest.raises(PreprocessError, match="resize_mode"):
        ImageTextDataModule(preprocess={"crop_pct": 0.9})


def test_knn_datasets_follow_the_loaded_checkpoint(tmp_path):
    """rl-gap knn / linear-probe build the datasets first, then load the module."""
    from rl_gap.data.preprocess import follow_model_preprocess

    dm = ImageFolderSSLDataModule(
        _folder(tmp_path / "tr"), _folder(tmp_path / "va"), num_workers=0, pin_memory=False,
        crop_pct=0.8,
    )  # fmt: skip
    dm.setup("validate")  # no model yet: ImageNet defaults
    assert dm.preprocessing.interpolation == "bilinear"
    net, _ = create_backbone("resnet18.a1_in1k")
    pp = follow_model_preprocess(net, dm.bank_set, dm.query_set)
    assert (pp.interpolation, pp.crop_pct) == ("bicubic", 0.8)  # the model's, the recipe's crop
    import timm.data

    config = {**timm.data.resolve_model_data_config(net), "crop_pct": 0.8}
    path = dm.query_set.base.dataset.samples[0][0]
    image = Image.open(path).convert("RGB")
    reference = timm.data.create_transform(**config, is_training=False)(image)
    assert torch.allclose(dm.query_set[0]["image"], reference, atol=1e-6)
