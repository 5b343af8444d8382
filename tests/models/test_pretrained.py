"""Pretrained weights by name through timm's and open_clip's own download and cache, offline.

The test writes tiny models' weights into a temporary Hugging Face cache in the
hub's layout, then builds the encoders by name in a child process with
``HF_HOME`` pointing there and ``HF_HUB_OFFLINE=1`` (the hub reads both at
import), and compares the loaded tensors with what it wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import open_clip
import pytest
import timm
import torch
import yaml
from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
from safetensors.torch import load_file

from rl_gap.models.clip import (
    CLIPEncoder,
    pretrained_tag_file,
    resolve_pretrained,
    tiny_clip_config,
)
from rl_gap.models.encoder import EmbeddingEncoder
from tests.models.hub_cache import scrambled, write_hub_repo

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys
from pathlib import Path
import open_clip, torch
from safetensors.torch import save_file
from rl_gap.models.clip import CLIPEncoder, pretrained_tag_file, tiny_clip_config
from rl_gap.models.encoder import EmbeddingEncoder

out = Path(sys.argv[1])
results = {}

def case(name, build):
    try:
        tensors = build()
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / f"{name}.safetensors"))
        results[name] = "ok"
    except Exception as err:
        results[name] = f"{type(err).__name__}: {err}"

def architecture(encoder):
    return {f"shape.{k}": torch.tensor(v.shape) for k, v in encoder.backbone.state_dict().items()}

def clip_tensors(encoder):
    return {**encoder.model.state_dict(), "_mean": torch.tensor(encoder.mean)}

case("timm_hub", lambda: EmbeddingEncoder("hf-hub:rl-gap-test/tiny-resnet", dim=0).backbone.state_dict())
case("timm_tag", lambda: EmbeddingEncoder("test_resnet", dim=0, pretrained=True).backbone.state_dict())
# a cache filled through timm's registered name holds the weights, not the repo's config.json
case("timm_hub_timm", lambda: EmbeddingEncoder("hf-hub:timm/test_resnet.r160_in1k", dim=0).backbone.state_dict())
case("timm_hub_timm_random", lambda: architecture(EmbeddingEncoder("hf-hub:timm/test_vit.r160_in1k", dim=0, pretrained=False)))
case("timm_missing", lambda: EmbeddingEncoder("test_vit", pretrained=True).state_dict())
case("clip_hub", lambda: clip_tensors(CLIPEncoder("hf-hub:rl-gap-test/tiny-clip")))
# a tiny architecture with a tag in open_clip's own registry, resolved like 'openai'
open_clip.pretrained._PRETRAINED["rl-gap-tiny"] = {
    "tiny_tag": open_clip.pretrained._pcfg(hf_hub="rl-gap-test/tiny-clip-tag/", mean=(0.25,) * 3)
}
open_clip.factory._MODEL_CONFIGS["rl-gap-tiny"] = tiny_clip_config()
case("clip_tag", lambda: clip_tensors(CLIPEncoder("rl-gap-tiny", pretrained="tiny_tag")))
# tags with a URL only: open_clip's own cache ~/.cache/clip, never the network when offline
open_clip.pretrained._PRETRAINED["rl-gap-tiny"]["url_tag"] = open_clip.pretrained._pcfg(
    url="https://rl-gap.invalid/tiny_url.pt"
)
open_clip.pretrained._PRETRAINED["rl-gap-tiny"]["url_missing"] = open_clip.pretrained._pcfg(
    url="https://rl-gap.invalid/missing.pt"
)
case("clip_url", lambda: clip_tensors(CLIPEncoder("rl-gap-tiny", pretrained="url_tag")))
case("clip_url_missing", lambda: clip_tensors(CLIPEncoder("rl-gap-tiny", pretrained="url_missing")))
case("clip_missing", lambda: clip_tensors(CLIPEncoder("ViT-B-32-quickgelu", pretrained="metaclip_400m")))
results["openai_file"] = pretrained_tag_file("ViT-B-32-quickgelu", "openai")[0]
# evaluation from a checkpoint: names the cache does not hold build offline, weights unread
from rl_gap.models.pretrained import weights_from_checkpoint

with weights_from_checkpoint():
    case("ckpt_timm_hub", lambda: architecture(EmbeddingEncoder("hf-hub:timm/test_vit.r160_in1k", dim=0)))
    case("ckpt_timm_tag", lambda: architecture(EmbeddingEncoder("test_vit", dim=0, pretrained=True)))
    case("ckpt_timm_file", lambda: architecture(EmbeddingEncoder("test_vit", dim=0, weights="/absent.pt")))
    case("ckpt_clip_tag", lambda: clip_tensors(CLIPEncoder("rl-gap-tiny", pretrained="url_missing")))
    case("ckpt_clip_mean", lambda: clip_tensors(CLIPEncoder("rl-gap-tiny", pretrained="tiny_tag")))
    case("ckpt_clip_file", lambda: clip_tensors(CLIPEncoder("rl-gap-tiny", pretrained="/absent.pt")))
    case("ckpt_timm_other_hub", lambda: architecture(EmbeddingEncoder("hf-hub:org/absent", dim=0)))
print(json.dumps(results))
"""


def _timm_config(architecture: str) -> dict:
    cfg = timm.models.get_pretrained_cfg(f"{architecture}.r160_in1k").to_dict()
    cfg = {k: v for k, v in cfg.items() if k not in ("url", "hf_hub_id", "architecture")}
    return {"architecture": architecture, "num_classes": 1000, "pretrained_cfg": cfg}


@pytest.fixture(scope="module")
def offline_builds(tmp_path_factory):
    """Reference tensors written to the cache, and what the child process loaded."""
    home = tmp_path_factory.mktemp("hf_home")
    cache = home / "hub"
    torch.manual_seed(0)
    resnet = timm.create_model("test_resnet", pretrained=False).state_dict()  # 1000 classes
    refs = {"timm_hub": scrambled(resnet, 1), "timm_tag": scrambled(resnet, 2)}
    write_hub_repo(
        cache,
        "rl-gap-test/tiny-resnet",
        {"config.json": _timm_config("test_resnet"), "model.safetensors": refs["timm_hub"]},
    )
    write_hub_repo(cache, "timm/test_resnet.r160_in1k", {"model.safetensors": refs["timm_tag"]})
    clip = CLIPEncoder(None, tiny_clip_config()).model.state_dict()
    refs["clip_hub"] = scrambled(clip, 3)
    refs["clip_tag"] = scrambled(clip, 4)
    hub_config = {"model_cfg": tiny_clip_config(), "preprocess_cfg": {"mean": [0.125] * 3}}
    write_hub_repo(
        cache,
        "rl-gap-test/tiny-clip",
        {"open_clip_config.json": hub_config, "open_clip_pytorch_model.bin": refs["clip_hub"]},
    )
    write_hub_repo(
        cache, "rl-gap-test/tiny-clip-tag", {"open_clip_model.safetensors": refs["clip_tag"]}
    )
    openai = write_hub_repo(
        cache, "timm/vit_base_patch32_clip_224.openai", {"open_clip_model.safetensors": {}}
    )
    refs["clip_url"] = scrambled(clip, 5)
    (home / ".cache" / "clip").mkdir(parents=True)
    torch.save(refs["clip_url"], home / ".cache" / "clip" / "tiny_url.pt")
    out = tmp_path_factory.mktemp("loaded")
    env = {
        **os.environ,
        "HF_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "TORCH_HOME": str(home / "torch"),
        "HOME": str(home),  # open_clip's URL cache is ~/.cache/clip
        "PYTHONPATH": str(ROOT),
    }
    env.pop("HF_HUB_CACHE", None)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"refs": refs, "out": out, "results": results, "home": home, "openai": openai}


def _loaded(builds, name):
    assert builds["results"][name] == "ok", builds["results"][name]
    return load_file(str(builds["out"] / f"{name}.safetensors"))


@pytest.mark.parametrize("name", ["timm_hub", "timm_tag", "timm_hub_timm"])
def test_timm_weights_by_name_come_from_the_hub_cache(offline_builds, name):
    """``hf-hub:org/repo`` and ``pretrained: true`` (timm's default tag) load the cached file;
    ``hf-hub:timm/<tag>`` loads it from a cache that holds the weights without config.json
    (as ``timm.create_model("<tag>", pretrained=True)`` fills it)."""
    loaded = _loaded(offline_builds, name)
    written = offline_builds["refs"]["timm_tag" if name == "timm_hub_timm" else name]
    backbone = {k: v for k, v in written.items() if not k.startswith("fc.")}
    assert set(loaded) == set(backbone)  # the classifier is dropped
    for key, value in backbone.items():
        assert torch.equal(loaded[key], value), key


@pytest.mark.parametrize("name", ["clip_hub", "clip_tag", "clip_url"])
def test_open_clip_weights_by_hub_name_and_tag_come_from_the_hub_cache(offline_builds, name):
    loaded = _loaded(offline_builds, name)
    mean = loaded.pop("_mean")
    written = offline_builds["refs"][name]
    assert set(loaded) == set(written)
    for key, value in written.items():
        assert torch.equal(loaded[key], value), key
    # the preprocessing that comes with the weights (Hub config / tag registry entry)
    expected = {"clip_hub": [0.125] * 3, "clip_tag": [0.25] * 3}.get(name)
    if expected is not None:
        assert mean.tolist() == expected


def test_openai_tag_of_the_clip_recipes_resolves_into_the_hub_cache(offline_builds):
    expected = offline_builds["openai"] / "open_clip_model.safetensors"
    assert offline_builds["results"]["openai_file"] == str(expected)


@pytest.mark.parametrize("name", ["timm_missing", "clip_missing", "clip_url_missing"])
def test_weights_missing_offline_fail_in_one_line_naming_the_cache(offline_builds, name):
    message = offline_builds["results"][name]
    assert message.startswith("PretrainedWeightsUnavailable: cannot load pretrained weights")
    assert "\n" not in message and "HF_HUB_OFFLINE=1" in message
    if name == "clip_url_missing":
        assert str(offline_builds["home"] / ".cache" / "clip") in message
    else:
        assert str(offline_builds["home"] / "hub") in message
    if name == "timm_missing":
        assert str(offline_builds["home"] / "torch" / "hub" / "checkpoints") in message


@pytest.mark.parametrize(
    "name", ["ckpt_timm_hub", "ckpt_timm_tag", "ckpt_timm_file", "timm_hub_timm_random"]
)
def test_evaluating_a_checkpoint_builds_timm_names_offline_without_their_weights(
    offline_builds, name
):
    """Inside ``weights_from_checkpoint`` an uncached ``hf-hub:timm/<registered name>``, a
    tag and a missing weights file build offline, as the architecture timm registers."""
    loaded = _loaded(offline_builds, name)
    reference = timm.create_model("test_vit.r160_in1k", pretrained=False, num_classes=0)
    expected = {f"shape.{k}": list(v.shape) for k, v in reference.state_dict().items()}
    assert {k: v.tolist() for k, v in loaded.items()} == expected


@pytest.mark.parametrize("name", ["ckpt_clip_tag", "ckpt_clip_mean", "ckpt_clip_file"])
def test_evaluating_a_checkpoint_builds_clip_tags_offline_with_their_preprocessing(
    offline_builds, name
):
    """An uncached open_clip tag builds offline, and its registry entry still sets mean/std."""
    loaded = _loaded(offline_builds, name)
    mean = loaded.pop("_mean")
    expected = [0.25] * 3 if name == "ckpt_clip_mean" else list(OPENAI_DATASET_MEAN)  # open_clip's
    assert mean.tolist() == torch.tensor(expected).tolist()
    assert set(loaded) == set(offline_builds["refs"]["clip_tag"])


def test_other_hub_repositories_still_need_their_config_from_the_cache(offline_builds):
    message = offline_builds["results"]["ckpt_timm_other_hub"]
    assert message.startswith("PretrainedWeightsUnavailable: cannot load pretrained weights")


def test_contradicting_or_unknown_names_are_refused():
    with pytest.raises(ValueError, match="either weights"):
        EmbeddingEncoder("rl_gap_convnet", weights="w.safetensors", pretrained=True)
    with pytest.raises(ValueError, match="no pretrained weights"):
        EmbeddingEncoder("rl_gap_convnet", pretrained=True)
    with pytest.raises(ValueError, match="unknown open_clip pretrained tag 'opnai'.*openai"):
        resolve_pretrained("ViT-B-32", "opnai")
    with pytest.raises(ValueError, match="trained with QuickGELU.*'ViT-B-32-quickgelu'"):
        pretrained_tag_file("ViT-B-32", "openai", open_clip.get_model_config("ViT-B-32"))
    with pytest.raises(ValueError, match="needs an open_clip model_name"):
        CLIPEncoder(None, tiny_clip_config(), pretrained="openai")
    with pytest.raises(ValueError, match="leave pretrained and model_config empty"):
        CLIPEncoder("hf-hub:org/repo", pretrained="openai")
    with pytest.raises(FileNotFoundError, match="CLIP checkpoint not found"):
        resolve_pretrained("ViT-B-32", "weights/missing.pt")


def test_paper_recipes_name_the_papers_pretrained_weights():
    """ImageNet ResNet-50 for SOP / iNaturalist, OpenAI CLIP ViT-B/32 for CC12M (gSAP §4)."""
    for recipe in sorted((ROOT / "recipes" / "metric_learning").glob("*.yaml")):
        args = yaml.safe_load(recipe.read_text())["model"]["init_args"]
        assert args["backbone"] == "hf-hub:timm/resnet50.tv_in1k", recipe.name
        assert args.get("weights") is None
    assert timm.models.get_pretrained_cfg("resnet50.tv_in1k").hf_hub_id == "timm/resnet50.tv_in1k"
    for recipe in sorted((ROOT / "recipes" / "clip").glob("*.yaml")):
        args = yaml.safe_load(recipe.read_text())["model"]["init_args"]
        assert (args["model_name"], args["pretrained"]) == ("ViT-B-32-quickgelu", "openai")
    entry = open_clip.get_pretrained_cfg("ViT-B-32-quickgelu", "openai")
    assert entry["quick_gelu"] and "openai" in entry["hf_hub"]


EVALUATE_OFFLINE = r"""
import json, sys
import open_clip, torch
from safetensors.torch import save_file
from rl_gap.models.clip import tiny_clip_config
from rl_gap.training.cli import run_lightning_cli

open_clip.pretrained._PRETRAINED["rl-gap-tiny"] = {
    "tiny_tag": open_clip.pretrained._pcfg(hf_hub="rl-gap-test/tiny-clip-tag/", mean=(0.25,) * 3)
}
open_clip.factory._MODEL_CONFIGS["rl-gap-tiny"] = tiny_clip_config()
stage, out, root = sys.argv[1:4]
common = [
    "--output_dir", out, "--wandb", "off", "--trainer.max_epochs", "1",
    "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "1",
    "--trainer.limit_predict_batches", "1", "--trainer.check_val_every_n_epoch", "1",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]
runs = {
    "ml": [
        "--config", f"{root}/recipes/demo/mnist_gsap.yaml", *common, "--run_name", "ml",
        "--model.init_args.backbone", "hf-hub:timm/test_resnet.r160_in1k",
        "--model.init_args.backbone_kwargs", "null", "--model.init_args.eval_plots", "false",
        "--data.init_args.eval_batch_size", "100",
    ],
    "clip": [
        "--config", f"{root}/recipes/demo/glyphs_gsap.yaml", *common, "--run_name", "clip",
        "--model.init_args.model_config", "null", "--model.init_args.model_name", "rl-gap-tiny",
        "--model.init_args.pretrained", "tiny_tag",
    ],
}
generator = torch.Generator().manual_seed(0)
digits, pictures = torch.rand(4, 1, 28, 28, generator=generator), torch.rand(4, 3, 32, 32, generator=generator)
outputs = {}
for name, argv in runs.items():
    ckpt = f"{out}/{name}/checkpoints/last.ckpt"
    commands = [["fit"]] if stage == "fit" else [["validate", "--ckpt_path", ckpt], ["predict", "--ckpt_path", ckpt]]
    for command in commands:
        module = run_lightning_cli([command[0], *argv, *command[1:]]).model.eval()
        with torch.no_grad():
            if name == "ml":
                outputs[f"ml_{command[0]}"] = module.encoder(digits)
            else:
                clip = module.clip
                outputs[f"image_{command[0]}"] = clip.encode_image(pictures)
                outputs[f"text_{command[0]}"] = clip.encode_text(clip.tokenize(["a glyph", "b"]))
                outputs[f"mean_{command[0]}"] = torch.tensor(clip.mean + clip.std)
save_file({k: v.contiguous() for k, v in outputs.items()}, f"{out}/{stage}.safetensors")
"""


@pytest.mark.slow
def test_checkpoints_of_named_weight_runs_evaluate_offline_without_a_cache(tmp_path):
    """fit with ``hf-hub:timm/...`` / an open_clip tag from a filled cache; then validate and
    predict the checkpoints with ``HF_HUB_OFFLINE=1`` and empty caches: same outputs, bit for bit,
    and CLIP's preprocessing still the tag's."""
    home = tmp_path / "filled"
    resnet = scrambled(timm.create_model("test_resnet", pretrained=False).state_dict(), 6)
    resnet = {k: v.abs() + 0.5 if k.endswith("running_var") else v for k, v in resnet.items()}
    write_hub_repo(
        home / "hub",
        "timm/test_resnet.r160_in1k",
        {"config.json": _timm_config("test_resnet"), "model.safetensors": resnet},
    )
    clip = CLIPEncoder(None, tiny_clip_config()).model.state_dict()
    write_hub_repo(
        home / "hub",
        "rl-gap-test/tiny-clip-tag",
        {"open_clip_model.safetensors": scrambled(clip, 7)},
    )
    out = tmp_path / "runs"
    for stage, hf_home in (("fit", home), ("evaluate", tmp_path / "empty")):
        hf_home.mkdir(exist_ok=True)
        env = {
            **os.environ,
            "HF_HOME": str(hf_home),
            "HF_HUB_OFFLINE": "1",
            "TORCH_HOME": str(hf_home / "torch"),
            "HOME": str(hf_home),
            "PYTHONPATH": str(ROOT),
        }
        env.pop("HF_HUB_CACHE", None)
        proc = subprocess.run(
            [sys.executable, "-c", EVALUATE_OFFLINE, stage, str(out), str(ROOT)],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    fetched = [p for p in (tmp_path / "empty").rglob("*") if p.suffix in (".safetensors", ".bin")]
    assert fetched == [] and not (tmp_path / "empty" / "hub").exists()
    trained = load_file(str(out / "fit.safetensors"))
    evaluated = load_file(str(out / "evaluate.safetensors"))
    assert (
        trained["mean_fit"].tolist() == torch.tensor([0.25] * 3 + list(OPENAI_DATASET_STD)).tolist()
    )
    for key, value in trained.items():
        for command in ("validate", "predict"):
            assert torch.equal(evaluated[key.replace("_fit", f"_{command}")], value), (key, command)
