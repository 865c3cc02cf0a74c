"""``experiments.bench.tables.write_csv``: the benchmark scripts' CSV writer is atomic."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from experiments.bench.tables import write_csv


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
    with pytest.raises(ValueError):  # a row with a key the header lacks
        write_csv(path, [{"a": 2}, {"a": 3, "extra": 4}])
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]
