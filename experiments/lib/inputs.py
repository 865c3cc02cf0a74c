"""Reading a tool's input files: one that is missing, unreadable or malformed becomes one
:class:`~experiments.lib.checks.ConfigError` naming the file, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from experiments.lib.checks import ConfigError

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
