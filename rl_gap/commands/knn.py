"""``rl-gap knn``: weighted kNN classification on frozen features of a checkpoint.

    rl-gap knn --checkpoint runs/.../last.ckpt --data imagefolder \\
        --train-dir /data/imagenet/train --val-dir /data/imagenet/val --k 10 20 100 200
    rl-gap knn --checkpoint runs/demo/mnist_moco_gsap/seed0/checkpoints/last.ckpt --data mnist5k
    rl-gap knn --checkpoint runs/.../last.ckpt --config recipes/moco_v3/in1k_vit_s_gsap.yaml \\
        --data-arg train_dir=/data/imagenet/train --data-arg val_dir=/data/imagenet/val

Any module with ``features(images)`` can be evaluated: MoCo v3 (backbone
features), metric learning (the embedding), CLIP (the image tower's
embedding). The module class: ``--module-class``, else the one the checkpoint
records (``rl-gap fit`` stores it), else the recipe's ``model:`` class, else
MoCo v3.

With ``--config`` the datasets come from the recipe's DataModule (its ``data:``
section, ``--data-arg KEY=VALUE`` overriding an argument); the DataModule must
provide ``bank_set`` and ``query_set`` (the MoCo v3 DataModules). Metric-learning
DataModules are refused: their test classes are disjoint from the training
classes, so there is nothing to classify them into (use ``--data``).

The training images (evaluation transform, no augmentation) form the labelled
bank, the validation images are classified (Wu et al. 2018; DINO's protocol:
k = 20, T = 0.07 by default). Prints one JSON object; ``--output`` also writes it.

The helpers here (checkpoint loading, evaluation datasets, feature
extraction) are shared with ``rl-gap linear-probe``.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from rl_gap.commands.progress import Bar, add_quiet_argument, progress

DEFAULT_MODULE = "rl_gap.modules.moco_v3.MoCoV3Module"
BUILT_IN_DATA = ("imagefolder", "mnist5k")


# ------------------------------------------------------------ shared helpers
def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """Checkpoint + dataset options common to ``knn`` and ``linear-probe``."""
    parser.add_argument("--checkpoint", required=True, help="Lightning checkpoint (.ckpt)")
    parser.add_argument(
        "--config",
        help="training recipe (YAML): datasets from its DataModule, module class from its model",
    )
    parser.add_argument(
        "--data-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --config: set a DataModule argument (YAML value), e.g. root=/data/x; repeatable",
    )
    parser.add_argument(
        "--module-class",
        default=None,
        help="LightningModule class path with a features(images) method (default: the class "
        f"recorded in the checkpoint, else the recipe's model class, else {DEFAULT_MODULE})",
    )
    parser.add_argument(
        "--data",
        choices=BUILT_IN_DATA,
        default=None,
        help="without --config: a built-in source (default: imagefolder)",
    )
    parser.add_argument("--train-dir", help="imagefolder: training images, <dir>/<class>/<image>")
    parser.add_argument("--val-dir", help="imagefolder: evaluated images, same layout")
    parser.add_argument(
        "--image-size", type=int, default=None, help="crop side (default: the model's input size)"
    )
    parser.add_argument("--num-train", type=int, default=4000, help="mnist5k: training digits")
    parser.add_argument("--batch-size", type=int, default=256, help="feature extraction batch")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output", help="also write the JSON result to this file")
    add_quiet_argument(parser)


def checkpoint_module_class(checkpoint: str | Path) -> str | None:
    """The LightningModule class a checkpoint records, or None.

    ``rl-gap fit`` (LightningCLI, subclass mode) stores it as the hyper-parameter
    ``_class_path``; the run's config (``checkpoint["rl_gap"]["config"]``) holds it too.
    The file is memory-mapped (no tensor is read) and unpickled with ``weights_only``;
    a checkpoint that needs more (objects beyond torch's allow-list, the legacy format)
    is read as ``load_from_checkpoint`` reads it next.
    """
    ckpt = None
    for options in ({"mmap": True, "weights_only": True}, {"weights_only": False}):
        try:
            ckpt = torch.load(str(checkpoint), map_location="cpu", **options)
            break
        except Exception:  # noqa: BLE001 - the next way of reading it, else no record
            continue
    if not isinstance(ckpt, dict):
        return None
    hparams = ckpt.get("hyper_parameters") or {}
    if isinstance(hparams.get("_class_path"), str):
        return hparams["_class_path"]
    config = (ckpt.get("rl_gap") or {}).get("config") or {}
    model = config.get("model") if isinstance(config, dict) else None
    if isinstance(model, dict) and isinstance(model.get("class_path"), str):
        return model["class_path"]
    return None


def load_module(checkpoint: str | Path, module_class: str = DEFAULT_MODULE, device: str = "cpu"):
    """Load a LightningModule checkpoint in eval mode; it must have ``features(images)``."""
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} not found")
    module_name, _, class_name = module_class.rpartition(".")
    if not module_name:
        raise ValueError(f"--module-class must be a dotted class path, got {module_class!r}")
    cls = getattr(importlib.import_module(module_name), class_name)
    module = cls.load_from_checkpoint(str(path), map_location=device)
    if not callable(getattr(module, "features", None)):
        raise ValueError(f"{module_class} has no features(images) method to evaluate")
    return module.to(device).eval()


def module_class_for(args: argparse.Namespace, recipe_class: str | None = None) -> str:
    """``--module-class``, else the checkpoint's recorded class, else the recipe's, else
    the default (checkpoints written without a record, e.g. by hand)."""
    return (
        args.module_class
        or checkpoint_module_class(args.checkpoint)
        or recipe_class
        or DEFAULT_MODULE
    )


def read_recipe(path: str | Path) -> dict[str, Any]:
    """A training recipe's top-level mapping (``trainer``, ``model``, ``data``, ...)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe {str(path)!r} not found")
    recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(recipe, dict):
        raise ValueError(f"recipe {str(path)!r} is not a YAML mapping")
    return recipe


def _data_overrides(pairs: list[str]) -> dict[str, Any]:
    import yaml

    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--data-arg wants KEY=VALUE, got {pair!r}")
        overrides[key.removeprefix("init_args.")] = yaml.safe_load(value)
    return overrides


def datamodule_from_recipe(path: str | Path, overrides: dict[str, Any] | None = None):
    """The recipe's DataModule, built from its ``data:`` section as ``rl-gap fit`` would
    (jsonargparse: types checked, values coerced), with ``overrides`` on its init arguments."""
    from jsonargparse import ArgumentParser
    from lightning import LightningDataModule

    section = read_recipe(path).get("data")
    if not isinstance(section, dict) or "class_path" not in section:
        raise ValueError(f"recipe {str(path)!r} has no data: section with a class_path")
    init_args = {**(section.get("init_args") or {}), **(overrides or {})}
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(LightningDataModule, "data", required=True)
    try:
        config = parser.parse_object(
            {"data": {"class_path": section["class_path"], "init_args": init_args}}
        )
    except Exception as err:  # jsonargparse reports a bad key or value at length
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"data: section of {str(path)!r}: {first}") from err
    return parser.instantiate_classes(config).data


def recipe_datasets(path: str | Path, overrides: dict[str, Any] | None = None):
    """(bank, queries) of a recipe's DataModule: its ``bank_set`` / ``query_set`` after setup."""
    dm = datamodule_from_recipe(path, overrides)
    if not hasattr(dm, "bank_set"):
        raise ValueError(
            f"{type(dm).__name__} (recipe {str(path)!r}) has no bank_set/query_set to classify: "
            "kNN and the linear probe need evaluation images labelled with the training classes "
            "(the MoCo v3 DataModules); a metric-learning split has disjoint test classes "
            "(evaluate it with rl-gap validate/test)"
        )
    dm.setup("validate")
    return dm.bank_set, dm.query_set


def recipe_module_class(path: str | Path) -> str | None:
    section = read_recipe(path).get("model")
    return section.get("class_path") if isinstance(section, dict) else None


def resolve_sources(args: argparse.Namespace) -> tuple[str, tuple[Dataset, Dataset]]:
    """(module class path, (training images, evaluated images)) from the command line."""
    if not Path(args.checkpoint).is_file():  # before reading any image
        raise FileNotFoundError(f"checkpoint {str(args.checkpoint)!r} not found")
    if args.config:
        if args.data is not None:
            raise ValueError("give either --config (a recipe's DataModule) or --data, not both")
        datasets = recipe_datasets(args.config, _data_overrides(args.data_arg))
        return module_class_for(args, recipe_module_class(args.config)), datasets
    if args.data_arg:
        raise ValueError("--data-arg sets a recipe's DataModule argument: it needs --config")
    return module_class_for(args), evaluation_datasets(args)


def load_sources(args: argparse.Namespace) -> tuple[str, Any, tuple[Dataset, Dataset]]:
    """(module class path, module in eval mode, (training images, evaluated images)) from
    the command line, the images transformed as the checkpoint's backbone expects."""
    from rl_gap.data.preprocess import follow_model_preprocess

    module_class, (train_set, eval_set) = resolve_sources(args)
    module = load_module(args.checkpoint, module_class, args.device)
    follow_model_preprocess(module, train_set, eval_set, quiet=args.quiet)
    return module_class, module, (train_set, eval_set)


def evaluation_datasets(args: argparse.Namespace) -> tuple[Dataset, Dataset]:
    """(training images, evaluated images), evaluation transform, ``{"image", "label"}`` items."""
    if args.data == "mnist5k":
        from rl_gap.data.ssl_mnist import MNIST5kSSLDataModule

        dm = MNIST5kSSLDataModule(num_train=args.num_train)
    else:
        if not args.train_dir or not args.val_dir:
            raise ValueError("--data imagefolder needs --train-dir and --val-dir")
        from rl_gap.data.ssl_imagefolder import ImageFolderSSLDataModule

        dm = ImageFolderSSLDataModule(
            args.train_dir, args.val_dir, image_size=args.image_size, num_workers=0
        )
    dm.setup("validate")
    return dm.bank_set, dm.query_set


@torch.no_grad()
def extract_features(
    module: Any,
    dataset: Dataset,
    batch_size: int = 256,
    num_workers: int = 0,
    device: str = "cpu",
    bar: Bar | None = None,
    name: str = "features",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Frozen features (N, F) float32 and labels (N,) int64 of a dataset, on ``device``.

    They stay there: the kNN vote (a Q x N GEMM) and the linear probe run where the model ran.
    ``bar``: a progress bar advanced per batch under ``name``.
    """
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    bar = bar or Bar(None)
    bar.start(name, len(loader))
    feats, labels = [], []
    for batch in loader:
        images, batch_labels = (
            (batch["image"], batch["label"]) if isinstance(batch, dict) else batch[:2]
        )
        feats.append(module.features(images.to(device)).float())
        labels.append(torch.as_tensor(batch_labels).long().to(device))
        bar.advance()
    if not feats:
        raise ValueError("the dataset is empty: no features to extract")
    return torch.cat(feats), torch.cat(labels)


def emit(result: dict[str, Any], output: str | None) -> None:
    from rl_gap.training.wandb_mode import log_command_result

    log_command_result(result)  # knn and linear-probe: the command's W&B run, when W&B is on
    text = json.dumps(result, indent=2)
    print(text)
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(text + "\n")


# ------------------------------------------------------------------ command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--k", type=int, nargs="+", default=[20], help="neighbours (several ok)")
    parser.add_argument("--temperature", type=float, default=0.07, help="vote weight exp(s/T)")


def run(args: argparse.Namespace) -> int:
    from rl_gap.metrics.functional.arguments import check_ks
    from rl_gap.metrics.knn import weighted_knn_accuracy

    check_ks(args.k, "--k")
    if args.temperature <= 0:
        raise ValueError(f"--temperature must be > 0, got {args.temperature}")
    module_class, module, (bank_set, query_set) = load_sources(args)
    too_large = [k for k in args.k if k > len(bank_set)]
    if too_large:
        # the classifier would use the whole bank and report it under the asked k
        raise ValueError(
            f"--k {too_large} exceeds the bank ({len(bank_set)} training images): "
            f"use k <= {len(bank_set)}"
        )
    with progress(args.quiet) as bar:
        bank, bank_labels = extract_features(
            module, bank_set, args.batch_size, args.num_workers, args.device, bar, "bank features"
        )
        queries, query_labels = extract_features(
            module, query_set, args.batch_size, args.num_workers, args.device, bar, "query features"
        )
    result: dict[str, Any] = {
        "checkpoint": str(args.checkpoint),
        "module_class": module_class,
        "num_bank": int(bank.shape[0]),
        "num_queries": int(queries.shape[0]),
        "temperature": args.temperature,
    }
    for k in args.k:
        accuracy = weighted_knn_accuracy(
            queries, query_labels, bank, bank_labels, k=k, temperature=args.temperature
        )
        result.update({f"k{k}/{name}": value for name, value in accuracy.items()})
    emit(result, args.output)
    return 0
