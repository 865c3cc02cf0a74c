"""Reading a file that must hold one mapping: a model's ``config.json``, a run's
``meta.json``, a catalog YAML."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_mapping(
    path: Path,
    parse: Callable[[str], Any],
    errors: type[Exception] | tuple[type[Exception], ...],
    fmt: str,
    expected: str,
) -> dict[str, Any]:
    """``parse`` of the file's UTF-8 text (a byte-order mark dropped), which must be a dict.
    ``ValueError("<path>: not <fmt> (<error>)")`` when ``parse`` raises one of ``errors``
    or the bytes are not UTF-8; ``ValueError("<path>: empty (expected <expected>)")`` for a
    file of nothing but white space; ``ValueError("<path>: expected <expected>")`` when the
    document is not a mapping."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not {fmt} (not UTF-8 text: {e.reason})") from None
    if not text.strip():
        raise ValueError(f"{path}: empty (expected {expected})")
    try:
        doc = parse(text)
    except errors as e:
        raise ValueError(f"{path}: not {fmt} ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected {expected}")
    return doc


def yaml_error_place(exc: Exception) -> str:
    """``"line L, column C"`` of a YAML parse error that marks its place (1-based), else
    ``""``."""
    mark = getattr(exc, "problem_mark", None)
    return "" if mark is None else f"line {mark.line + 1}, column {mark.column + 1}"
