"""Reading a tool's input files: one that is missing, unreadable or malformed becomes one
:class:`~experiments.lib.checks.ConfigError` naming the file, never a traceback."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from experiments.lib.checks import ConfigError
from sim.cost.calibrated import check_step_numbers

# What reading and parsing a file raises on bad content: pandas' EmptyDataError and
# ParserError, json's JSONDecodeError and a bad number are ValueErrors.
UNREADABLE = (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@contextmanager
def reading(path: Path | str, key: str) -> Iterator[None]:
    """Inside, an error of reading or parsing ``path`` is a ConfigError on ``key`` naming it.
    Wrap only the read itself: a program error there would be reported as bad input."""
    try:
        yield
    except UNREADABLE as exc:
        raise ConfigError(key, f"cannot read {path} ({first_line(exc)})") from None


def read_csv(path: Path | str, key: str) -> pd.DataFrame:
    with reading(path, key):
        return pd.read_csv(path)


def read_json(path: Path | str, key: str) -> Any:
    with reading(path, key):
        return json.loads(Path(path).read_text())


def check_whole(path: Path | str, key: str | None = None) -> None:
    """Raise a :class:`ConfigError` on ``key`` (default: the path) naming ``path`` and the
    line (the header is line 1) when the CSV cannot be read, is empty, or was cut short: its
    last line has no newline, or a line has fewer fields than the header. Blank lines are
    skipped, as pandas does."""
    key = str(path) if key is None else key
    where = "" if key == str(path) else f"{path}: "
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(key, f"{where}cannot read it ({first_line(exc)})") from None
    if not text.strip():
        raise ConfigError(key, f"{where}is empty: no header, no rows")
    if not text.endswith(("\n", "\r")):
        line = len(text.splitlines())
        raise ConfigError(key, f"{where}line {line} has no newline at its end: the file was "
                          "cut short (truncated, or read while being written)")  # fmt: skip
    reader = csv.reader(io.StringIO(text))
    header = next(reader)
    for row in reader:
        if row and len(row) < len(header):
            raise ConfigError(key, f"{where}line {reader.line_num} has {len(row)} of the "
                              f"header's {len(header)} fields: the file was cut short")  # fmt: skip


def read_run_steps(run_dir: Path | str, key: str = "run_dir") -> pd.DataFrame:
    """A run directory's ``steps.csv``, whole: a missing file, one cut short
    (:func:`check_whole`), a count or time that is not a finite number >= 0
    (:func:`sim.cost.calibrated.check_step_numbers`) or another number of rows than
    ``metrics.json``'s ``num_steps`` (when the run has one) is a ConfigError on ``key``
    naming the file, never a frame that quietly holds part of the run."""
    path = Path(run_dir) / "steps.csv"
    if not path.is_file():
        raise ConfigError(key, "no steps.csv (not a run directory)", str(run_dir))
    check_whole(path, key)
    with reading(path, key):
        steps = pd.read_csv(path)
    try:
        check_step_numbers(steps)
    except ValueError as exc:
        raise ConfigError(key, f"{path}: {exc}") from None
    metrics = Path(run_dir) / "metrics.json"
    if metrics.is_file():
        doc = read_json(metrics, key)
        num_steps = doc.get("num_steps") if isinstance(doc, dict) else None
        if isinstance(num_steps, int) and len(steps) != num_steps:
            raise ConfigError(
                key, f"{path}: {len(steps)} steps, but {metrics.name} counts {num_steps}"
                " (a file cut short or from another run)",
            )  # fmt: skip
    return steps
