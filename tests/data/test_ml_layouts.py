"""On-disk layouts of the metric-learning sets: a missing list file names its path and layout."""

from __future__ import annotations

import pytest

from rl_gap.data.ml_layouts import read_cub, read_inat, read_sop


@pytest.mark.parametrize(
    "read, args, expected",
    [
        (read_sop, ("train",), "Ebay_train.txt"),
        (read_inat, ("test",), "Inaturalist_test_set1.txt"),
        (read_cub, ("train",), "images.txt"),
    ],
)
def test_missing_files_name_path_and_layout(tmp_path, read, args, expected):
    with pytest.raises(FileNotFoundError, match=expected) as info:
        read(tmp_path, *args)
    assert str(tmp_path) in str(info.value) and "Expected" in str(info.value)
