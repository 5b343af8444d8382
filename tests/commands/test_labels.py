"""Label files read exactly: 64-bit ids, re-spelled numbers, object arrays, header rows."""

from __future__ import annotations

import numpy as np
import pytest

from rl_gap.commands.labels import encode_labels, load_labels
from rl_gap.commands.npy_io import load_npy

BIG = [2**60, 2**60 + 1, 2**62 + 7, -(2**61) - 3]  # float64 merges 2**60 and 2**60 + 1


def _same_class_pairs(q_codes, d_codes):
    return {(i, j) for i, a in enumerate(q_codes) for j, b in enumerate(d_codes) if a == b}


def test_64bit_text_ids_are_read_as_int64_exactly(tmp_path):
    (tmp_path / "ids.txt").write_text("\n".join(str(v) for v in BIG) + "\n")
    labels = load_labels(tmp_path / "ids.txt")
    q_codes, _ = encode_labels(labels, labels)
    assert q_codes.dtype == np.int64
    assert [int(v) for v in q_codes] == BIG  # Python ints: the reference, no float on the way


@pytest.mark.parametrize("text_side", ["query", "database"])
def test_64bit_text_ids_match_int64_npy_ids(tmp_path, text_side):
    """The issue's case: ids 2**60, 2**60+1 in a .txt against the same ids in an int64 .npy."""
    text_ids = [BIG[1], BIG[0], BIG[1], BIG[3], BIG[2]]
    npy_ids = [BIG[0], BIG[1], BIG[2], BIG[3], BIG[0]]
    (tmp_path / "t.txt").write_text("\n".join(map(str, text_ids)) + "\n")
    np.save(tmp_path / "n.npy", np.array(npy_ids, dtype=np.int64))
    text, npy = load_labels(tmp_path / "t.txt"), load_labels(tmp_path / "n.npy")
    if text_side == "query":
        q_codes, d_codes = encode_labels(text, npy)
        expected = _same_class_pairs(text_ids, npy_ids)
    else:
        q_codes, d_codes = encode_labels(npy, text)
        expected = _same_class_pairs(npy_ids, text_ids)
    assert _same_class_pairs(q_codes.tolist(), d_codes.tolist()) == expected
    assert len(expected) == 6  # not the 10 a float64 round trip (2**60 == 2**60 + 1) gives


def test_distinct_64bit_ids_in_one_file_are_not_called_respellings(tmp_path):
    (tmp_path / "ids.txt").write_text(f"{2**60}\n{2**60 + 1}\n")
    codes, _ = encode_labels(load_labels(tmp_path / "ids.txt"), np.array([2**60]))
    assert codes.tolist() == [2**60, 2**60 + 1]


@pytest.mark.parametrize("rows", [["1", "01", "2"], ["1", "1.0", "2"]])
def test_one_number_written_two_ways_is_refused(tmp_path, rows):
    (tmp_path / "l.txt").write_text("\n".join(rows) + "\n")
    with pytest.raises(ValueError, match=r"the same number but different text"):
        encode_labels(load_labels(tmp_path / "l.txt"), np.array([1, 2]))


def test_float_ids_beyond_2_53_are_refused():
    floats = np.array([2.0**60, 2.0**60 + 256, 3.0])  # neighbouring ids are gone in float64
    with pytest.raises(ValueError, match=r"beyond 2\*\*53 .* store ids as integers"):
        encode_labels(floats, np.array([3, 4]))
    # exact below it: 2**53 itself is still a float64 integer
    q, d = encode_labels(np.array([2.0**53, 1.0]), np.array([2**53, 1], dtype=np.int64))
    assert q.tolist() == d.tolist() == [2**53, 1]


def test_integer_text_outside_int64_is_refused(tmp_path):
    (tmp_path / "l.txt").write_text(f"{2**64}\n1\n")
    with pytest.raises(ValueError, match="outside the 64-bit integer range"):
        encode_labels(load_labels(tmp_path / "l.txt"), np.array([1]))


def test_uint64_ids_above_int64_are_refused():
    with pytest.raises(ValueError, match="does not fit in int64"):
        encode_labels(np.array([2**63 + 5], dtype=np.uint64), np.array([1]))


def test_object_npy_is_named_as_an_object_array_not_a_damaged_file(tmp_path):
    np.save(tmp_path / "obj.npy", np.array(["cat", 3, None], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match=r"holds an array of Python objects \(dtype object\)") as e:
        load_npy(tmp_path / "obj.npy", mmap=False)
    assert "truncated" not in str(e.value) and "dtype=str" in str(e.value)
    # the advised form loads and compares as class names
    np.save(tmp_path / "names.npy", np.array(["cat", "3", "dog"], dtype=str))
    q, d = encode_labels(load_labels(tmp_path / "names.npy"), np.array(["dog", "cat"]))
    assert q.tolist() == [q[0], q[1], d[0]] and q[0] == d[1]


@pytest.mark.parametrize(
    "count, kept, note",
    [
        (4, ["cat", "1", "2", "2"], False),  # one row per embedding: 'cat' is a label
        (3, ["1", "2", "2"], True),  # one row more: 'cat' is a header
        (None, ["1", "2", "2"], True),  # unknown: a header, said so
    ],
)
def test_text_first_row_above_numbers_is_settled_by_the_count(tmp_path, capsys, count, kept, note):
    (tmp_path / "l.txt").write_text("cat\n1\n2\n2\n")
    assert load_labels(tmp_path / "l.txt", count).tolist() == kept
    err = capsys.readouterr().err
    assert ("first row 'cat' read as a header" in err) == note
