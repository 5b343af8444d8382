"""``backbone_kwargs`` reach the backbone's constructor or are refused naming the key."""

import pytest
import timm
import torch

import rl_gap.models  # noqa: F401  (registers rl_gap_convnet)
from rl_gap.models.encoder import EmbeddingEncoder


def test_convnet_width_is_used():
    net = timm.create_model("rl_gap_convnet", pretrained=False, num_classes=0, width=8)
    assert net.num_features == 32  # 4 x width
    assert net(torch.zeros(2, 3, 28, 28)).shape == (2, 32)


@pytest.mark.parametrize("backbone", ["rl_gap_convnet", "resnet18"])
def test_misspelt_backbone_kwarg_is_refused_naming_it(backbone):
    with pytest.raises((ValueError, TypeError), match="widht"):
        EmbeddingEncoder(backbone, dim=4, in_chans=1, backbone_kwargs={"widht": 8})
