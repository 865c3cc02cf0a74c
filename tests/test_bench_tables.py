"""``experiments.bench.tables.write_csv``: the benchmark scripts' CSV writer is atomic."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from experiments.bench.tables import print_table, write_csv


def test_rows_round_trip_and_no_rows_is_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_csv(path, [{"a": 1, "b": "x"}, {"a": 2.5, "b": "y,z"}])
    with path.open() as f:
        assert list(csv.DictReader(f)) == [{"a": "1", "b": "x"}, {"a": "2.5", "b": "y,z"}]
    write_csv(path, [])
    assert path.read_text() == ""
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]


def test_a_write_that_fails_leaves_the_old_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_csv(path, [{"a": 1}])
    before = path.read_text()

    class Unwritable:
        def __str__(self) -> str:
            raise ValueError("cannot be written")

    with pytest.raises(ValueError):  # fails in the middle of writing the rows
        write_csv(path, [{"a": 2}, {"a": Unwritable()}])
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]


def test_rows_with_different_keys_share_one_header(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_csv(path, [{"a": 1}, {"a": 2, "b": 3}, {"b": 4}])
    assert path.read_text().splitlines() == ["a,b", "1,", "2,3", ",4"]


def test_a_printed_table_has_every_row_s_keys(capsys: pytest.CaptureFixture[str]) -> None:
    """Columns are the union of the rows' keys in first-seen order; a missing cell is blank
    (a key the first row lacks is not dropped, nor is a row without one an error)."""
    print_table("t", [{"a": 1}, {"a": 2.5, "b": "x"}, {"b": "y"}])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == ["== t ==", "  a  b", "  1   ", "2.5  x", "     y"]
