"""The runs index (``experiments.lib.results.append_index``) under concurrent writers: one
header, every row, none torn."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

from experiments.lib.results import append_index

ROWS = 15


def _append_rows(path: str, start: float, writer: int) -> None:
    while time.time() < start:  # all writers begin together, on an empty index
        pass
    for i in range(ROWS):
        append_index(Path(path), "simulate", "ok", Path(f"/x/{writer}/{i}"), [f"i={i}"])


def test_writers_starting_together_on_a_new_index_write_one_header(tmp_path: Path) -> None:
    """Each writer checks for the header under the lock: a writer that opened the empty
    file before another's first row went in must not write a second header."""
    for trial in range(3):
        path = tmp_path / f"index{trial}.csv"
        start = time.time() + 0.3
        procs = [mp.Process(target=_append_rows, args=(str(path), start, w)) for w in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        lines = path.read_text().splitlines()
        headers = [i for i, line in enumerate(lines) if line.startswith("time,")]
        assert headers == [0], (trial, headers)
        assert len(lines) == 1 + 4 * ROWS
