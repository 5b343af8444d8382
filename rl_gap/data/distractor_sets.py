"""DataModules of the distractor-query tasks (DISC21, Met, ILIAS, WildlifeReID-10k).

Training is class-labelled m-per-class batches as in
:class:`rl_gap.data.metric_learning.MetricLearningDataModule` (DISC21: every
training image is its own class, so the m images of a class are m augmented
views of it). The evaluation split is one dataset of queries, then database
items, then background items; :meth:`DistractorDataModule.evaluation_roles`
tells them apart, and ``rl_gap.callbacks.RetrievalEvaluation`` then reports
gAP with and without distractor queries, per-query metrics over the queries
with a match, and, with a background set, the same after query-side score
normalisation (``norm_*``; ``rl_gap.metrics.distractor``). Layouts:
``rl_gap.data.distractor_layouts`` and ``docs/distractor_tasks.md``.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from rl_gap.data.distractor_layouts import (
    BACKGROUND,
    DistractorTask,
    image_files,
    read_disc21,
    read_ilias,
    read_met,
    read_wildlife,
)
from rl_gap.data.metric_learning import MetricLearningDataModule
from rl_gap.data.ml_layouts import ImageList, read_folder_or_csv
from rl_gap.metrics.distractor import ROLE_BACKGROUND, ROLE_DATABASE, ROLE_QUERY
from rl_gap.metrics.functional.score_norm import ScoreNorm

BACKGROUND_LAYOUT = "a folder of background images (any depth) or a 'path,label' CSV"


class DistractorDataModule(MetricLearningDataModule):
    """Base DataModule of a task with distractor queries; subclasses implement :meth:`read_task`.

    Args:
        score_norm: report ``norm_*`` metrics after query-side score normalisation
            against the background set (the task's own, or ``background``).
        score_norm_beta: beta of the normalisation (SSCD: 1.0).
        score_norm_neighbors: ``(first, last)`` 0-based background neighbours averaged
            (SSCD: (0, 2), the mean of the 3 most similar).
        background: folder or ``path,label`` CSV of background images (labels unused);
            default: the task's own (DISC21: its training images), else none.
        background_size: keep this many background images (seeded random subset;
            None = all).
        **kwargs: :class:`MetricLearningDataModule` settings (``val_split > 0``
            validates on held-out training classes, leave-one-out; else on the task).
    """

    def __init__(
        self,
        score_norm: bool = False,
        score_norm_beta: float = 1.0,
        score_norm_neighbors: tuple[int, int] = (0, 2),
        background: str | None = None,
        background_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("queries_per_class") is not None:
            raise ValueError("queries_per_class does not apply: the task defines its queries")
        super().__init__(**kwargs)
        if background_size is not None and background_size < 1:
            raise ValueError(f"background_size must be >= 1 or None (all), got {background_size}")
        first, last = tuple(score_norm_neighbors)
        self.norm = ScoreNorm(float(score_norm_beta), int(first), int(last)) if score_norm else None
        self.background, self.background_size = background, background_size
        self._task: DistractorTask | None = None
        self._roles: torch.Tensor | None = None

    @abc.abstractmethod
    def read_task(self) -> DistractorTask:
        """The task's images (``rl_gap.data.distractor_layouts``)."""

    @property
    def task(self) -> DistractorTask:
        if self._task is None:
            self._task = self.read_task()
        return self._task

    def _background(self) -> ImageList | None:
        if self.norm is None:
            return None
        if self.background:
            source = Path(self.background).expanduser()
            if source.is_file():
                items = read_folder_or_csv(source)
            else:
                files = image_files(source, "background", BACKGROUND_LAYOUT)
                items = ImageList(files, [BACKGROUND] * len(files))
        else:
            items = self.task.background
        if items is None:
            raise ValueError(
                f"score_norm needs a background set: {type(self).__name__} has none of its "
                "own, set data.init_args.background to a folder or CSV of images"
            )
        paths = items.paths
        if self.background_size is not None and self.background_size < len(paths):
            g = torch.Generator().manual_seed(self.seed)
            pick = torch.randperm(len(paths), generator=g)[: self.background_size]
            paths = [paths[i] for i in sorted(pick.tolist())]
        return ImageList(paths, [BACKGROUND] * len(paths))

    def build_split(self, split: str, train: bool) -> Dataset:
        if split == "train":
            return self.image_list_dataset(self.task.train, train)
        parts = [(self.task.queries, ROLE_QUERY), (self.task.database, ROLE_DATABASE)]
        background = self._background()
        if background is not None:
            parts.append((background, ROLE_BACKGROUND))
        items = ImageList(
            [p for part, _ in parts for p in part.paths],
            [y for part, _ in parts for y in part.labels],
        )
        self._roles = torch.cat(
            [torch.full((len(part),), role, dtype=torch.long) for part, role in parts]
        )
        return self.image_list_dataset(items, train=False)

    def evaluation_roles(self, split: str) -> torch.Tensor | None:
        """Role of every item (by dataset index) of an evaluation split that is the task's
        query/database/background set; None for a leave-one-out split (held-out classes)."""
        dataset = self.datasets.get(split)
        if dataset is None or dataset is not self.datasets.get("test"):
            return None
        return self._roles

    @property
    def score_norm(self) -> ScoreNorm | None:
        """Normalisation settings when enabled (read by the evaluation callback)."""
        return self.norm

    def validation_source(self) -> str | None:
        if self.val_split <= 0:
            return None
        return f"held-out {self.val_split:.0%} of training classes (leave-one-out)"


class DISC21DataModule(DistractorDataModule):
    """DISC21 image copy detection: references, mostly unmatched queries, training images.

    Args:
        root: DISC21 folder (``DISC21_LAYOUT`` in ``rl_gap.data.distractor_layouts``).
        query_dir / reference_dir / train_dir / ground_truth: names inside ``root``.
        **kwargs: :class:`DistractorDataModule` settings (background: the training images).
    """

    def __init__(
        self,
        root: str,
        query_dir: str = "val_query",
        reference_dir: str = "val_ref",
        train_dir: str = "training",
        ground_truth: str = "val_groundtruth_matches.csv",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.root = root
        self.names = (query_dir, reference_dir, train_dir, ground_truth)

    def read_task(self) -> DistractorTask:
        return read_disc21(self.root, *self.names)


class MetDataModule(DistractorDataModule):
    """The Met: exhibit images (training set = database), queries from the Met and
    from other collections (``test_other``, ``test_noart``: distractor queries).

    Args:
        root: Met folder (``MET_LAYOUT``); query_split: "test" or "val".
    """

    def __init__(self, root: str, query_split: str = "test", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.root, self.query_split = root, query_split

    def read_task(self) -> DistractorTask:
        return read_met(self.root, self.query_split)


class ILIASDataModule(DistractorDataModule):
    """ILIAS: instance queries, their positives among YFCC100M distractors.

    Args:
        root: ILIAS folder (``ILIAS_LAYOUT``).
        train: training images, a ``<class>/<image>`` folder or ``path,label`` CSV.
    """

    def __init__(self, root: str, train: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.root, self.train = root, train

    def read_task(self) -> DistractorTask:
        return read_ilias(self.root, self.train)


class WildlifeReIDDataModule(DistractorDataModule):
    """WildlifeReID-10k: identities of the train split (training set = database),
    test queries of unknown identities are distractor queries.

    Args:
        root: dataset folder (``WILDLIFE_LAYOUT``); metadata: the CSV inside it.
    """

    def __init__(self, root: str, metadata: str = "metadata.csv", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.root, self.metadata = root, metadata

    def read_task(self) -> DistractorTask:
        return read_wildlife(self.root, self.metadata)
