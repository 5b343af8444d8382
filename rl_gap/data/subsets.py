"""Seeded training-set subsets for the scarce-data protocol.

The gSAP paper's scarce-data protocol keeps a fraction γ of the *eligible*
training classes (those with at least ρ images) and ρ random images of each
kept class, with three seeds per setting. :func:`scarce_subset` draws that
subset from the labels alone, so any DataModule can apply it
(``data.class_fraction``, ``data.images_per_class``).

One random key per class and one per image are drawn from the seed, and the
classes (images) with the smallest keys are kept: for a fixed seed the subsets
are nested — the classes kept at γ = 5% are among those kept at 10%, and the
images kept at ρ = 2 are among those kept at ρ = 4 for a class eligible for both.
"""

from __future__ import annotations

import math

import torch


def kept_class_count(num_eligible: int, class_fraction: float, min_classes: int = 2) -> int:
    """Number of classes kept: ``round(γ · eligible)`` (halves up), at least ``min_classes``.

    Args:
        num_eligible: classes with enough images.
        class_fraction: γ in (0, 1].
        min_classes: floor on the count (a metric-learning batch needs negatives,
            i.e. two classes), capped at ``num_eligible``.
    """
    if not 0.0 < class_fraction <= 1.0:
        raise ValueError(f"class_fraction must be in (0, 1], got {class_fraction}")
    wanted = math.floor(class_fraction * num_eligible + 0.5)
    return min(num_eligible, max(min_classes, wanted))


def scarce_subset(
    labels: torch.Tensor,
    class_fraction: float = 1.0,
    images_per_class: int | None = None,
    seed: int = 0,
    min_classes: int = 2,
) -> torch.Tensor:
    """Sorted indices of the items kept by the scarce-data protocol.

    Args:
        labels: (N,) integer class labels of the training set.
        class_fraction: γ, fraction of eligible classes kept, in (0, 1].
        images_per_class: ρ, images kept per class (None = all images of a kept class;
            every class is then eligible).
        seed: the draw's seed (same seed, same subset).
        min_classes: keep at least this many classes (default 2: negatives exist).

    Returns:
        (K,) int64 indices into ``labels``, ascending.

    Raises:
        ValueError: bad shapes/values, or fewer than ``min_classes`` eligible classes.
    """
    labels = torch.as_tensor(labels)
    if labels.ndim != 1 or labels.numel() == 0:
        raise ValueError(f"labels must be a non-empty 1-D tensor, got shape {tuple(labels.shape)}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integers, got {labels.dtype}")
    if images_per_class is not None and images_per_class < 1:
        raise ValueError(f"images_per_class must be >= 1 or None, got {images_per_class}")
    classes, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    g = torch.Generator().manual_seed(int(seed))
    class_key = torch.rand(len(classes), generator=g, dtype=torch.float64)
    image_key = torch.rand(len(labels), generator=g, dtype=torch.float64)
    rho = images_per_class
    eligible = torch.nonzero(counts >= (rho or 1)).flatten()
    if len(eligible) < min_classes:
        raise ValueError(
            f"only {len(eligible)} classes have >= {rho or 1} images; the scarce-data subset "
            f"needs at least {min_classes} eligible classes"
        )
    k = kept_class_count(len(eligible), class_fraction, min_classes)
    kept = eligible[torch.argsort(class_key[eligible], stable=True)[:k]]
    candidates = torch.nonzero(torch.isin(inverse, kept)).flatten()
    if rho is None:
        return candidates
    # within each kept class, the rho images with the smallest keys
    order = candidates[torch.argsort(image_key[candidates], stable=True)]
    order = order[torch.argsort(inverse[order], stable=True)]
    cls = inverse[order]
    first = torch.searchsorted(cls, cls, side="left")
    rank_in_class = torch.arange(len(order)) - first
    return torch.sort(order[rank_in_class < rho]).values


def scarce_batch(
    batch_size: int, m_per_class: int, num_classes: int, images_per_class: int | None
) -> tuple[int, int]:
    """(batch_size, m_per_class) that a subset with few classes/images can fill.

    ``m = min(m_per_class, ρ)`` (no image repeated inside a batch) and at most
    ``num_classes`` classes per batch: ``batch = min(batch_size // m, num_classes) · m``.
    """
    m = min(m_per_class, images_per_class) if images_per_class else m_per_class
    classes_per_batch = max(1, min(batch_size // m, num_classes))
    return classes_per_batch * m, m
