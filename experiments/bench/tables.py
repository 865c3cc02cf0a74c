"""Benchmark output: a plain-text table on stdout and the same rows as a CSV file.

Every benchmark script prints what it measured and writes it, with these two helpers. A
library module: no command line."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from experiments.lib.results import write_atomic


def write_csv(path: Path, rows: list[dict]) -> None:
    """``rows`` as a CSV at ``path``, atomically: a reader sees the old file or the whole new
    one. The columns are every row's keys, in the order they first appear; a row without
    one leaves its cell empty. No rows: an empty file."""
    columns = list(dict.fromkeys(key for row in rows for key in row))

    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as f:
            if rows:
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows(rows)

    write_atomic(path, write)


def _cell(row: dict, key: str) -> str:
    """One printed cell: a float to 4 significant digits, a key the row lacks blank."""
    if key not in row:
        return ""
    value = row[key]
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_table(title: str, rows: list[dict]) -> None:
    """``rows`` as a plain-text table under ``title``: the columns are every row's keys in
    the order they first appear (as :func:`write_csv`'s), a row without one blank there."""
    print(f"\n== {title} ==")
    if not rows:
        print("(no rows)")
        return
    cols = list(dict.fromkeys(key for row in rows for key in row))
    cells = [[_cell(r, c) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
    for row in cells:
        print("  ".join(x.rjust(w) for x, w in zip(row, widths, strict=True)))


def not_a_command(module: str, used_by: str) -> None:
    """What ``python -m`` on a library module does: one line on stderr saying so and who
    uses it, and exit status 2."""
    print(f"error: {module} is a library module with no command line; it is used by "
          f"{used_by}", file=sys.stderr)  # fmt: skip
    sys.exit(2)


if __name__ == "__main__":
    not_a_command("experiments.bench.tables", "every benchmark script that prints or writes "
                  "a table (experiments.bench.*, experiments.calibrate_overhead)")  # fmt: skip
