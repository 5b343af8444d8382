"""``rl-gap linear-probe``: a linear classifier on frozen features of a checkpoint.

    rl-gap linear-probe --checkpoint runs/.../last.ckpt --data imagefolder \\
        --train-dir /data/imagenet/train --val-dir /data/imagenet/val --epochs 90
    rl-gap linear-probe --checkpoint runs/demo/mnist_moco_gsap/seed0/checkpoints/last.ckpt --data mnist5k
    rl-gap linear-probe --checkpoint runs/.../last.ckpt --config recipes/demo/mnist_moco_gsap.yaml

``--config`` takes the datasets from the recipe's DataModule (see ``rl-gap knn``).

Features are extracted once (evaluation transform: resize + centre crop) and
the probe, a single ``nn.Linear``, is trained on them with SGD (momentum 0.9,
cosine learning rate, weight decay on the weight only), optionally after
standardising each feature with the training mean/std (as a BatchNorm without
affine would). This is the cheap frozen-feature variant: MoCo v3's own
protocol re-runs the frozen backbone on augmented crops every epoch
(RandomResizedCrop + flip, 90 epochs), which costs a full backbone pass per
epoch; numbers from the two protocols are not interchangeable.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from rl_gap.commands.knn import (
    add_source_arguments,
    emit,
    extract_features,
    load_sources,
)
from rl_gap.commands.progress import progress
from rl_gap.optim import check_optimizer_settings


@dataclass
class LinearProbeResult:
    """Trained probe (on the possibly standardised features) and its accuracies."""

    weight: torch.Tensor  # (C, F)
    bias: torch.Tensor  # (C,)
    mean: torch.Tensor  # (F,) subtracted before the probe (zeros if not standardised)
    std: torch.Tensor  # (F,) divided by before the probe (ones if not standardised)
    metrics: dict[str, float]

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return ((features - self.mean) / self.std) @ self.weight.T + self.bias


def train_linear_probe(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    val_features: torch.Tensor,
    val_labels: torch.Tensor,
    epochs: int = 90,
    lr: float = 0.1,
    batch_size: int = 256,
    weight_decay: float = 0.0,
    momentum: float = 0.9,
    standardize: bool = True,
    num_classes: int | None = None,
    seed: int = 0,
    on_epoch: Callable[[], None] | None = None,
) -> LinearProbeResult:
    """Fit ``nn.Linear`` by minibatch SGD on mean cross-entropy + (wd/2)·‖W‖².

    Args:
        train_features, val_features: (N, F) float features.
        train_labels, val_labels: (N,) integer classes.
        epochs, lr, batch_size, weight_decay, momentum: SGD settings; the
            learning rate follows a cosine from ``lr`` to 0 over all steps.
        standardize: subtract the training mean and divide by the training std.
        num_classes: C (default: largest label + 1).
        seed: initialisation and shuffling seed.
        on_epoch: called after every epoch (a progress bar).

    Returns:
        :class:`LinearProbeResult` with ``metrics`` = val top-1/top-5, train top-1.
    """
    _check_probe_inputs(train_features, train_labels, val_features, val_labels, epochs, batch_size)
    # lr/weight_decay/momentum finite and in range: `--lr nan` used to train to chance.
    check_optimizer_settings("sgd", lr, weight_decay, momentum=momentum)
    x = train_features.float()
    y = train_labels.long().to(x.device)
    val_labels = val_labels.to(x.device)
    val_features = val_features.to(x.device)
    if num_classes is None:
        num_classes = int(max(y.max(), val_labels.max())) + 1
    if standardize:
        mean, std = x.mean(0), x.std(0).clamp(min=1e-6)
    else:
        mean = torch.zeros(x.shape[1], device=x.device)
        std = torch.ones(x.shape[1], device=x.device)
    x = (x - mean) / std
    sgd = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}
    probe = _fit_probe(x, y, num_classes, epochs, batch_size, sgd, seed, on_epoch)
    from rl_gap.metrics.knn import topk_accuracy  # torchmetrics: not needed for --help

    result = LinearProbeResult(
        probe.weight.detach().clone(), probe.bias.detach().clone(), mean, std, {}
    )
    with torch.no_grad():
        val = topk_accuracy(result.logits(val_features.float()), val_labels.long(), (1, 5))
        train = topk_accuracy(result.logits(train_features.float()), y, (1,))
    result.metrics = {"top1": val["top1"], "top5": val["top5"], "train_top1": train["top1"]}
    return result


def _check_probe_inputs(train_features, train_labels, val_features, val_labels, epochs, batch_size):
    """One-line errors for empty, mis-shaped or non-finite features and bad loop sizes."""
    for name, x, y in (("train", train_features, train_labels), ("val", val_features, val_labels)):
        if x.ndim != 2 or x.shape[0] == 0 or y.shape != (x.shape[0],):
            raise ValueError(
                f"{name} features must be (N > 0, F) with (N,) labels, got "
                f"{tuple(x.shape)} and {tuple(y.shape)}"
            )
        if not torch.isfinite(x).all():
            raise ValueError(f"{name} features contain NaN or inf")
    if train_features.shape[1] != val_features.shape[1]:
        raise ValueError("train and val features differ in width")
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"need epochs >= 1, batch_size >= 1; got {epochs}, {batch_size}")


def _fit_probe(
    x: torch.Tensor, y: torch.Tensor, num_classes: int, epochs: int, batch_size: int,
    sgd: dict[str, float], seed: int, on_epoch: Callable[[], None] | None = None,
) -> nn.Linear:  # fmt: skip
    """SGD (cosine learning rate to 0, no weight decay on the bias) of a linear layer on
    standardised features ``x``."""
    # The probe trains where the features are; its random draws come from a CPU generator,
    # so a seed gives the same probe on any device.
    generator = torch.Generator().manual_seed(seed)
    probe = nn.Linear(x.shape[1], num_classes).to(x.device)
    with torch.no_grad():
        # MoCo v3's probe init: N(0, 0.01²) weights, zero bias.
        init = torch.empty(probe.weight.shape).normal_(0.0, 0.01, generator=generator)
        probe.weight.copy_(init)
        probe.bias.zero_()
    optimizer = torch.optim.SGD(
        [
            {"params": [probe.weight], "weight_decay": sgd["weight_decay"]},
            {"params": [probe.bias], "weight_decay": 0.0},
        ],
        lr=sgd["lr"],
        momentum=sgd["momentum"],
    )
    total = epochs * math.ceil(x.shape[0] / batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1.0 + math.cos(math.pi * step / total))
    )
    for _ in range(epochs):
        order = torch.randperm(x.shape[0], generator=generator).to(x.device)
        for start in range(0, x.shape[0], batch_size):
            idx = order[start : start + batch_size]
            loss = F.cross_entropy(probe(x[idx]), y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        if on_epoch is not None:
            on_epoch()
    return probe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--lr", type=float, default=0.1, help="SGD peak learning rate")
    parser.add_argument("--probe-batch-size", type=int, default=256)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument(
        "--no-standardize", action="store_true", help="train on raw features (no mean/std)"
    )
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    check_optimizer_settings("sgd", args.lr, args.weight_decay)  # before the feature pass
    for option, value in (("--epochs", args.epochs), ("--probe-batch-size", args.probe_batch_size)):
        if value < 1:
            raise ValueError(f"{option} must be >= 1, got {value}")
    module_class, module, (train_set, val_set) = load_sources(args)
    loader = (args.batch_size, args.num_workers, args.device)
    with progress(args.quiet) as bar:
        train = extract_features(module, train_set, *loader, bar, "train features")
        val = extract_features(module, val_set, *loader, bar, "val features")
        bar.start("probe epochs", args.epochs)
        result = train_linear_probe(
            *train,
            *val,
            epochs=args.epochs,
            lr=args.lr,
            batch_size=args.probe_batch_size,
            weight_decay=args.weight_decay,
            standardize=not args.no_standardize,
            seed=args.seed,
            on_epoch=bar.advance,
        )
    emit(
        {
            "checkpoint": str(args.checkpoint),
            "module_class": module_class,
            "num_train": int(train[0].shape[0]),
            "num_val": int(val[0].shape[0]),
            **result.metrics,
        },
        args.output,
    )
    return 0
