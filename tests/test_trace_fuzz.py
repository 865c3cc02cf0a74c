"""Fuzzing the trace readers: any file content either reads into requests or raises
``TraceFormatError`` whose message names the file and the line (JSON datasets: the line of
a JSON syntax error, else the entry) — never another exception."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.request import Request
from core.workload.datasets_json import read_alpaca_json, read_sharegpt_json
from core.workload.trace_io import (
    NATIVE_COLUMNS,
    NATIVE_MAGIC,
    TraceFormatError,
    read_azure_trace,
    read_mooncake_trace,
    read_trace,
    read_vidur_trace,
)

# Characters that make up the readers' syntax, plus a few that break it.
_ALPHABET = st.sampled_from(list('0123456789,.-+e:" {}[]\n\tTabxyzINFnan\x00é'))
_TEXT = st.text(_ALPHABET, max_size=200)
_FIELD = st.one_of(
    st.integers(-5, 5000).map(str),
    st.floats(allow_nan=True).map(repr),
    st.text(_ALPHABET, max_size=6),
)

HEADERS: dict[str, tuple[Callable[..., list[Request]], str]] = {
    "native": (read_trace, f"{NATIVE_MAGIC}\n{','.join(NATIVE_COLUMNS)}\n"),
    "azure": (read_azure_trace, "TIMESTAMP,ContextTokens,GeneratedTokens\n"),
    "vidur": (read_vidur_trace, "arrived_at,num_prefill_tokens,num_decode_tokens\n"),
    "mooncake": (read_mooncake_trace, ""),
}
LOCATION = re.compile(r", (line \d+|file|entry \d+): ")


def _read(reader: Callable[..., list[Request]], data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.txt"
        path.write_bytes(data)
        try:
            out = (
                reader(str(path))
                if reader not in JSON_READERS
                else reader(str(path), tokenize=str.split)
            )
        except TraceFormatError as exc:
            message = str(exc)
            assert message.startswith(str(path)), message
            assert LOCATION.search(message), message
            return
        assert all(isinstance(r, Request) for r in out)


JSON_READERS = (read_sharegpt_json, read_alpaca_json)
_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(kind=st.sampled_from(sorted(HEADERS)), body=_TEXT)
def test_line_readers_on_any_text(kind: str, body: str) -> None:
    reader, header = HEADERS[kind]
    _read(reader, (header + body).encode("utf-8", "surrogatepass"))


@_SETTINGS
@given(
    kind=st.sampled_from(sorted(HEADERS)),
    rows=st.lists(st.lists(_FIELD, min_size=1, max_size=12), max_size=5),
)
def test_line_readers_on_csv_like_rows(kind: str, rows: list[list[str]]) -> None:
    """Rows with the right shape but any field values (numbers, NaN, negatives, text)."""
    reader, header = HEADERS[kind]
    if kind == "mooncake":
        keys = ("timestamp", "input_length", "output_length", "hash_ids")
        body = "\n".join(
            "{" + ", ".join(f'"{k}": {v}' for k, v in zip(keys, r, strict=False)) + "}"
            for r in rows
        )
    else:
        body = "\n".join(",".join(r) for r in rows)
    _read(reader, (header + body).encode())


@_SETTINGS
@given(reader=st.sampled_from(JSON_READERS), body=_TEXT)
def test_json_datasets_on_any_text(reader, body: str) -> None:
    _read(reader, body.encode())


@_SETTINGS
@given(data=st.binary(max_size=64), kind=st.sampled_from(sorted(HEADERS)))
def test_readers_on_any_bytes(data: bytes, kind: str) -> None:
    reader, header = HEADERS[kind]
    _read(reader, header.encode() + data)
