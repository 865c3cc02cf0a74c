"""What every figure notebook shares: where the results are, a clear error when they are
missing or malformed, reading result tables and run metrics, and saving a figure
(``experiments.report.figures.save``: PNG + PDF with TrueType fonts) next to the results.
Notebooks read result files only; they never run a simulation.

A result file that is missing raises :class:`MissingResultsError`; one that is cut short or
lacks what the notebook reads (a column, or a row the figure draws: :func:`require_rows`)
raises a ``ConfigError`` whose one line names the file (and the line, the header being
line 1, and the column). Run as a script
(``python notebooks/<nb>.py``), either ends the notebook with that line on stderr and exit
status 2, no traceback (``HYDRA_FULL_ERROR=1`` keeps the traceback); in a kernel it shows in
its cell.

Importing this module puts the repository root on ``sys.path`` so that notebooks opened
from ``notebooks/`` can import ``core`` and ``experiments``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.lib.checks import ConfigError
from experiments.lib.cli import full_errors
from experiments.lib.inputs import check_whole, first_line
from experiments.report.figures import save  # re-exported: the one saver

__all__ = [
    "MissingResultsError",
    "read_metrics",
    "read_result",
    "require",
    "require_rows",
    "results_dir",
    "save",
]

RESULTS_ENV = "KVLAB_RESULTS"
DEFAULT_RESULTS = Path("results") / "reproduce"


class MissingResultsError(FileNotFoundError):
    """A result file a notebook needs does not exist."""


def results_dir() -> Path:
    """The results directory: ``$KVLAB_RESULTS`` if set, else ``results/reproduce``.
    A relative path is taken from the repository root (not the notebook's folder)."""
    path = Path(os.environ.get(RESULTS_ENV) or DEFAULT_RESULTS).expanduser()
    return path if path.is_absolute() else REPO / path


def require(results: Path, *names: str) -> list[Path]:
    """Paths of ``names`` under ``results``; raise :class:`MissingResultsError` naming every
    missing file and the command that writes them."""
    missing = [n for n in names if not (results / n).is_file()]
    if missing:
        raise MissingResultsError(
            f"{results} lacks {', '.join(missing)}. Run `python -m experiments.reproduce "
            f"--out {results}` first, or set {RESULTS_ENV} to the directory it wrote."
        )
    return [results / n for n in names]


def read_result(
    path: Path,
    text: Sequence[str] = (),
    numbers: Sequence[str] = (),
    maybe: Sequence[str] = (),
    flags: Sequence[str] = (),
    passing: Sequence[str] = (),
    choices: Mapping[str, Collection[str]] | None = None,
) -> pd.DataFrame:
    """The result CSV at ``path`` exactly as ``pd.read_csv`` reads it, once it is whole
    (a header and at least one row, no line cut short) and holds every column named, each
    cell as the notebook needs it: ``text`` not empty (and, for a column of ``choices``,
    one of its values); ``numbers`` finite numbers; ``maybe`` numbers that may be empty,
    NaN or infinite; ``flags`` True or False; ``passing`` numbers, finite on every row
    whose ``passes`` is True (a run that met the threshold finished requests). Anything
    else raises a ``ConfigError`` naming the file, line and column."""
    check_whole(path)
    try:
        table = pd.read_csv(path)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(str(path), f"cannot read it ({first_line(exc)})") from None
    if table.empty:
        raise ConfigError(str(path), "has a header but no rows")
    flags = list(dict.fromkeys([*flags, *(["passes"] if passing else [])]))
    named = dict.fromkeys([*text, *numbers, *maybe, *flags, *passing])
    missing = [c for c in named if c not in table.columns]
    if missing:
        raise ConfigError(str(path), f"no column {', '.join(missing)}; the notebook reads it")

    def fail(row: int, column: str, problem: str, *got: Any) -> NoReturn:
        raise ConfigError(str(path), f"line {row + 2}, column {column}: {problem}", *got)

    for column in text:
        cells = table[column]
        for row in cells.index[cells.isna()][:1]:
            fail(row, column, "empty")
        allowed = (choices or {}).get(column)
        if allowed is not None:
            for row in cells.index[~cells.isin(list(allowed))][:1]:
                fail(row, column, f"not one of {', '.join(map(str, allowed))}", cells[row])
    for column in flags:
        cells = table[column]
        if not pd.api.types.is_bool_dtype(cells):
            for row in cells.index[~cells.isin([True, False, "True", "False"])][:1]:
                fail(row, column, "not True or False", cells[row])
    for column in (*numbers, *maybe, *passing):
        cells = table[column]
        values = pd.to_numeric(cells, errors="coerce")
        for row in cells.index[values.isna() & cells.notna()][:1]:
            fail(row, column, "not a number", cells[row])
        finite = np.isfinite(values.to_numpy(dtype=float))
        if column in passing:
            finite |= ~table["passes"].to_numpy(dtype=bool)
        elif column in maybe:
            continue
        for i in np.flatnonzero(~finite)[:1]:
            row, value = cells.index[i], values.iloc[i]
            on = " on a passing row" if column in passing else ""
            if math.isnan(value):
                fail(row, column, f"empty or NaN{on}; a finite number is needed")
            fail(row, column, f"not finite{on}", value)
    return table


def require_rows(
    path: Path, table: pd.DataFrame, keys: pd.DataFrame | Mapping[str, Sequence[Any]], why: str
) -> None:
    """Raise a ``ConfigError`` naming ``path`` (the file ``table`` was read from), the first
    key that no row of ``table`` holds, and ``why`` the notebook needs it. ``keys``: a frame
    whose rows are the keys (its columns are columns of ``table``), or column -> values,
    every combination of which is a key. Values compare as text."""
    if isinstance(keys, Mapping):
        product = pd.MultiIndex.from_product(list(keys.values()), names=list(keys))
        keys = product.to_frame(index=False)
    columns = list(keys.columns)
    held = set(table[columns].astype(str).itertuples(index=False, name=None))
    for key in keys[columns].astype(str).itertuples(index=False, name=None):
        if key not in held:
            named = ", ".join(f"{c} {v}" for c, v in zip(columns, key, strict=True))
            raise ConfigError(str(path), f"no row for {named}; {why}")


def read_metrics(
    results: Path, labels: dict[str, str], numbers: Sequence[str] = ()
) -> pd.DataFrame:
    """One row per ``system -> run label``: ``runs/<label>/metrics.json`` plus a ``system``
    column, in the order of ``labels``. A file that is not a JSON object, or lacks one of
    ``numbers`` as a finite number, raises a ``ConfigError`` naming it and the key."""
    paths = require(results, *(f"runs/{label}/metrics.json" for label in labels.values()))
    rows = []
    for system, path in zip(labels, paths, strict=True):
        try:
            doc = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(str(path), f"cannot read it ({first_line(exc)})") from None
        if not isinstance(doc, dict):
            raise ConfigError(str(path), "not a JSON object of run metrics")
        for key in numbers:
            if key not in doc:
                raise ConfigError(str(path), f"no key {key}; the notebook reads it")
            value = doc[key]
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not (number and math.isfinite(value)):
                raise ConfigError(str(path), f"key {key}: not a finite number", value)
        rows.append(doc | {"system": system})
    return pd.DataFrame(rows)


def _one_line_exit() -> None:
    """Run as a script from ``notebooks/``, end on a missing or bad result file with its
    one line and exit status 2 (see the module doc)."""
    if Path(sys.argv[0]).resolve().parent != Path(__file__).resolve().parent:
        return
    default = sys.excepthook

    def hook(kind: type[BaseException], err: BaseException, tb: Any) -> None:
        if full_errors() or not isinstance(err, MissingResultsError | ConfigError):
            default(kind, err, tb)
            return
        print(err.line() if isinstance(err, ConfigError) else f"error: {err}", file=sys.stderr)
        raise SystemExit(2)

    sys.excepthook = hook


_one_line_exit()
