"""Trace files: the native kvlab format (round-trips exactly) and readers for public traces.

Native format, CSV with a first line ``# kvlab-trace v1`` and then the header::

    request_id,arrival_time,prompt_len,output_len,n,beam_width,temperature,top_p,top_k,seed,
    prompt_token_ids

Floats are written with ``repr`` (shortest string that parses back to the same double), ``seed``
is empty for None, ``prompt_token_ids`` is space-separated ids or empty. Rows keep their ids
and order (an exact round trip, even of rows out of arrival order); ``build_workload`` sorts
them by arrival (ties by request id) before windowing.

Readers of public traces (Azure LLM-inference CSV, Mooncake JSONL, Vidur CSV) share one policy:
rows are sorted by arrival time (stable; out-of-order rows are accepted, not an error), arrival
times are made relative to the earliest row and multiplied by ``time_scale`` (0.5 replays
twice as fast), vLLM's benchmark filter is applied unless ``apply_filter=False`` (then a row
with zero tokens is an error), the length cap ``max_total_tokens`` (when given) drops the rows
whose prompt + output exceed it, ``limit`` keeps the first requests that pass, and request ids
are 0, 1, ... in arrival order (over the rows kept). Rows dropped by the filter or the cap
are counted in one log line each, on the ``core.workload.trace_io.dropped`` logger.
Malformed input raises :class:`TraceFormatError` naming the file, the line and the problem
(the JSON dataset readers in ``datasets_json`` share this policy).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from core.request import Request, RequestError, SamplingParams
from core.workload.filters import MAX_MODEL_LEN, MAX_PROMPT_LEN, REASONS, drop_reasons, over_cap

log = logging.getLogger(__name__)
# the rows the length filter or cap dropped, on a logger of their own: the rate searches
# (capacity) build each system's first run before their batch logging, where it is said once
# a system, and silence it in the runs, which would repeat it at every rate
drop_log = logging.getLogger(f"{__name__}.dropped")

NATIVE_MAGIC = "# kvlab-trace v1"
NATIVE_COLUMNS: tuple[str, ...] = (
    "request_id",
    "arrival_time",
    "prompt_len",
    "output_len",
    "n",
    "beam_width",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "prompt_token_ids",
)
PathLike = str | Path
_EPOCH = datetime(1970, 1, 1)
_GZIP_MAGIC = b"\x1f\x8b"


class TraceFormatError(RequestError):
    """A trace file is malformed; the message names the file, the line and the problem."""

    def __init__(self, path: PathLike, where: int | str, problem: str) -> None:
        loc = f"line {where}" if isinstance(where, int) else where
        super().__init__(f"{path}, {loc}: {problem}")
        self.path = str(path)
        self.where = where
        self.problem = problem


# ---------------------------------------------------------------- field parsing


def _int(path: PathLike, line: int, name: str, text: str, exact: bool = True) -> int:
    """A non-negative integer; with ``exact=False`` an integral float like ``12.0`` too."""
    s = text.strip()
    try:
        value = int(s)
    except ValueError:
        try:
            f = float(s)
        except ValueError:
            raise TraceFormatError(path, line, f"{name} is not a number: {text!r}") from None
        if exact or not math.isfinite(f) or f != int(f):
            raise TraceFormatError(path, line, f"{name} is not an integer: {text!r}") from None
        value = int(f)
    if value < 0:
        raise TraceFormatError(path, line, f"{name} is negative: {text!r}")
    return value


def _float(path: PathLike, line: int, name: str, text: str) -> float:
    """A finite non-negative float."""
    try:
        value = float(text)
    except ValueError:
        raise TraceFormatError(path, line, f"{name} is not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise TraceFormatError(path, line, f"{name} must be finite and >= 0, got {text!r}")
    return value


def refuse_compressed(path: PathLike, data: bytes) -> None:
    """A gzip-compressed input (``data``, its bytes) is a :class:`TraceFormatError` saying
    so: every input is read as text."""
    if data.startswith(_GZIP_MAGIC):
        raise TraceFormatError(path, "file", "gzip-compressed: decompress it first (gunzip -k)")


def read_text_lines(path: PathLike) -> list[str]:
    """The lines of a UTF-8 text file (a leading byte-order mark is not part of them); a
    byte that is not UTF-8 is a :class:`TraceFormatError` naming its line, and a
    gzip-compressed file one saying so (it is not read compressed)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise TraceFormatError(path, "file", "no such file") from None
    refuse_compressed(path, data)
    try:
        return data.decode("utf-8-sig").splitlines()  # a BOM is dropped
    except UnicodeDecodeError as exc:
        start = exc.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data.count(b"\n", 0, start) + 1
        raise TraceFormatError(path, line, f"not UTF-8 text ({exc.reason})") from None


def jsonl_values(path: PathLike, lines: Iterable[str]) -> Iterator[tuple[int, Any]]:
    """(line number from 1, parsed value) for each non-blank line of a JSON Lines text;
    :class:`TraceFormatError` naming the line for one that is not JSON."""
    for line, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            yield line, json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(path, line, f"invalid JSON: {exc.msg}") from None


def jsonl_objects(path: PathLike, lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """:func:`jsonl_values` where every value must be a JSON object."""
    for line, obj in jsonl_values(path, lines):
        if not isinstance(obj, dict):
            raise TraceFormatError(path, line, "expected a JSON object")
        yield line, obj


def _csv_fields(path: PathLike, line: int, text: str) -> list[str]:
    """The fields of one CSV line ``text`` (line ``line``), a field as long as the line may
    be (a native row's ``prompt_token_ids`` of a long prompt outgrows the csv module's
    default field limit of 131,072 characters); a quoted field still open at its end (a line
    break inside quotes: the rows are read line by line) is a :class:`TraceFormatError`
    saying so."""
    limit = csv.field_size_limit()
    csv.field_size_limit(max(limit, len(text)))
    try:
        reader = csv.reader([text, ""])
        fields = next(reader)
    finally:
        csv.field_size_limit(limit)
    if reader.line_num > 1:  # the open quote read on into the next line
        raise TraceFormatError(
            path, line, "a quoted field is not closed on this line: quoted line breaks are not "
            "read; put each row on one line",
        )  # fmt: skip
    return fields


def _csv_rows(
    path: PathLike, lines: list[str], header_line: int, required: Sequence[str]
) -> Iterable[tuple[int, dict[str, str]]]:
    """(line number, {column: text}) for each non-blank row after the header line."""
    if len(lines) < header_line:
        raise TraceFormatError(path, header_line, "missing header row")
    header = _csv_fields(path, header_line, lines[header_line - 1])
    header = [h.strip() for h in header]
    missing = [c for c in required if c not in header]
    if missing:
        found = lines[header_line - 1].strip()
        found = found if len(found) <= 80 else found[:77] + "..."
        raise TraceFormatError(
            path, header_line,
            f"missing column(s) {', '.join(missing)} (the header reads {found!r}; "
            "columns are separated by commas)",
        )  # fmt: skip
    for idx in range(header_line, len(lines)):
        if not lines[idx].strip():
            continue
        fields = _csv_fields(path, idx + 1, lines[idx])
        if len(fields) != len(header):
            raise TraceFormatError(
                path, idx + 1, f"expected {len(header)} fields, got {len(fields)}"
            )
        yield idx + 1, dict(zip(header, fields, strict=True))


# ---------------------------------------------------------------- native format


def _fmt_float(x: float) -> str:
    return repr(float(x))


def write_trace(path: PathLike, requests: Iterable[Request]) -> None:
    """Write requests in the native format (exact round trip with :func:`read_trace`).

    Request ids must be >= 0 (the reader rejects negative ids as malformed).
    """
    with Path(path).open("w", encoding="utf-8", newline="") as f:
        f.write(NATIVE_MAGIC + "\n")
        f.write(",".join(NATIVE_COLUMNS) + "\n")
        for r in requests:
            if r.request_id < 0:
                raise RequestError(f"request_id must be >= 0 to be written, got {r.request_id}")
            s = r.sampling
            ids = "" if r.prompt_token_ids is None else " ".join(map(str, r.prompt_token_ids))
            row = (
                str(r.request_id),
                _fmt_float(r.arrival_time),
                str(r.prompt_len),
                str(r.output_len),
                str(s.n),
                str(s.beam_width),
                _fmt_float(s.temperature),
                _fmt_float(s.top_p),
                str(s.top_k),
                "" if s.seed is None else str(s.seed),
                ids,
            )
            f.write(",".join(row) + "\n")


def _native_row(path: PathLike, line: int, row: dict[str, str]) -> Request:
    def signed_int(name: str) -> int:
        try:
            return int(row[name])
        except ValueError:
            raise TraceFormatError(path, line, f"{name} is not an integer: {row[name]!r}") from None

    ids_text = row["prompt_token_ids"].strip()
    ids = None
    if ids_text:
        ids = tuple(_int(path, line, "prompt_token_ids", tok) for tok in ids_text.split())
    seed = None if not row["seed"].strip() else signed_int("seed")
    try:
        sampling = SamplingParams(
            n=_int(path, line, "n", row["n"]),
            beam_width=_int(path, line, "beam_width", row["beam_width"]),
            temperature=_float(path, line, "temperature", row["temperature"]),
            top_p=_float(path, line, "top_p", row["top_p"]),
            top_k=signed_int("top_k"),
            seed=seed,
        )
        return Request(
            request_id=_int(path, line, "request_id", row["request_id"]),
            arrival_time=_float(path, line, "arrival_time", row["arrival_time"]),
            prompt_len=_int(path, line, "prompt_len", row["prompt_len"]),
            output_len=_int(path, line, "output_len", row["output_len"]),
            sampling=sampling,
            prompt_token_ids=ids,
        )
    except TraceFormatError:
        raise
    except RequestError as exc:
        raise TraceFormatError(path, line, str(exc)) from None


def read_trace(path: PathLike) -> list[Request]:
    """Read a native trace written by :func:`write_trace`, in file order (rows out of
    arrival order are accepted; ``build_workload`` sorts them by arrival)."""
    lines = read_text_lines(path)
    if not lines or lines[0].strip() != NATIVE_MAGIC:
        raise TraceFormatError(path, 1, f"first line must be {NATIVE_MAGIC!r}")
    header = [h.strip() for h in _csv_fields(path, 2, lines[1])] if len(lines) > 1 else []
    extra = [h for h in header if h not in NATIVE_COLUMNS]
    if extra:
        raise TraceFormatError(path, 2, f"unknown column(s) {', '.join(extra)}")
    requests, seen = [], {}
    for ln, row in _csv_rows(path, lines, 2, NATIVE_COLUMNS):
        request = _native_row(path, ln, row)
        if request.request_id in seen:
            raise TraceFormatError(
                path, ln, f"request_id {request.request_id} repeats line {seen[request.request_id]}"
            )
        seen[request.request_id] = ln
        requests.append(request)
    return requests


# ---------------------------------------------------------------- public traces


def _to_requests(
    path: PathLike,
    rows: list[tuple[int, float, int, int]],
    time_scale: float,
    max_model_len: int,
    max_prompt_len: int,
    limit: int | None,
    apply_filter: bool,
    sampling: SamplingParams | None,
    token_ids: list[tuple[int, ...] | None] | None = None,
    dataset: bool = False,
    max_total_tokens: int | None = None,
    kept_rows: list[int] | None = None,
) -> list[Request]:
    """Shared policy of the readers. ``rows``: (line, arrival seconds, prompt, output);
    ``dataset``: a dataset file without times, whose sampling expects the filter (rows it
    drops are logged at info level; a timed trace's, which lose arrivals, as a warning);
    ``max_total_tokens``: the length cap (:func:`core.workload.filters.over_cap`), applied
    to the rows the filter keeps and logged as a warning of its own; ``kept_rows``, when
    given, gets the index in ``rows`` of each request returned, in order."""
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise RequestError(f"time_scale must be finite and > 0, got {time_scale}")
    if limit is not None and limit < 0:
        raise RequestError(f"limit must be >= 0, got {limit}")
    order = sorted(range(len(rows)), key=lambda k: rows[k][1])
    t0 = rows[order[0]][1] if rows else 0.0
    prompt = _clipped([rows[k][2] for k in order])
    output = _clipped([rows[k][3] for k in order])
    if apply_filter:
        reasons = drop_reasons(prompt, output, max_model_len, max_prompt_len)
        keep = (reasons < 0).tolist()
        if not all(keep):
            counts = np.bincount(reasons[reasons >= 0], minlength=len(REASONS))
            why = ", ".join(f"{n} {r}" for r, n in zip(REASONS, counts, strict=True) if n)
            drop_log.log(
                logging.INFO if dataset else logging.WARNING,
                "%s: the length filter (apply_filter) dropped %d of %d rows before the run "
                "(%s)", path, len(keep) - sum(keep), len(keep), why,
            )  # fmt: skip
    else:
        for k in order:
            line, _, p, o = rows[k]
            if p < 1 or o < 1:
                raise TraceFormatError(
                    path, line, f"{p} prompt / {o} output tokens cannot make a request"
                )
        keep = [True] * len(order)
    if max_total_tokens is not None:
        keep = _cap(path, prompt, output, keep, max_total_tokens)
    params = sampling if sampling is not None else SamplingParams()
    out: list[Request] = []
    for k, kept in zip(order, keep, strict=True):
        if not kept:
            continue
        if limit is not None and len(out) >= limit:
            break
        _, t, p, o = rows[k]
        ids = token_ids[k] if token_ids is not None else None
        if kept_rows is not None:
            kept_rows.append(k)
        out.append(Request(len(out), (t - t0) * time_scale, p, o, params, ids))
    return out


_LEN_CLIP = 2**61  # past every cap and context; two of them sum without int64 overflow


def _clipped(lengths: list[int]) -> np.ndarray:
    """Token counts as int64 for the filter and the cap, each clipped at :data:`_LEN_CLIP`
    (a count read from a file may be any size: unclipped, one past int64 overflows the
    conversion, and one near it wraps a prompt + output sum below every cap)."""
    return np.array([min(n, _LEN_CLIP) for n in lengths], dtype=np.int64)


def _cap(
    path: PathLike, prompt: np.ndarray, output: np.ndarray, keep: list[bool], cap: int
) -> list[bool]:
    """``keep`` less the rows over the length cap ``cap``, with a warning counting those it
    drops (among the rows ``keep`` holds; silent when it drops none)."""
    over = over_cap(prompt, output, cap)
    dropped = int(np.count_nonzero(over & np.asarray(keep, dtype=bool)))
    if dropped:
        drop_log.warning(
            "%s: max_total_tokens=%d dropped %d of %d rows before the run (prompt + output "
            "over %d tokens)", path, cap, dropped, len(keep), cap,
        )  # fmt: skip
    return [k and not o for k, o in zip(keep, over.tolist(), strict=True)]


# YYYY-MM-DD[ HH:MM:SS] (anything datetime.fromisoformat reads, without a '.'), then an
# optional fraction of up to 9 digits, then an optional UTC offset (Z, ±HH:MM or ±HHMM)
_TIMESTAMP = re.compile(
    r"(?P<body>[^.]*?)(?:\.(?P<frac>\d{1,9}))?(?P<offset>[Zz]|[+-]\d{2}:?\d{2})?"
)


def _timestamp_ns(path: PathLike, line: int, text: str) -> int:
    """``YYYY-MM-DD HH:MM:SS[.fraction][offset]`` as integer ns since the epoch, in UTC.

    Up to 9 fraction digits; the offset is ``Z``, ``±HH:MM`` or ``±HHMM`` (the Azure 2024
    release writes ``+00:00``) and is subtracted; a time without one is taken as UTC (the
    2023 release's naive times). Anything else is a :class:`TraceFormatError` naming the line.
    """
    match = _TIMESTAMP.fullmatch(text.strip())
    try:
        if match is None:
            raise ValueError
        dt = datetime.fromisoformat(match["body"])
    except ValueError:
        raise TraceFormatError(
            path, line, f"unparsable TIMESTAMP {text!r} (expected YYYY-MM-DD HH:MM:SS"
            "[.fraction][+HH:MM|Z])",
        ) from None  # fmt: skip
    offset_s = _offset_s(path, line, text, match["offset"])
    if dt.tzinfo is not None:  # an offset fromisoformat read (e.g. "+05")
        if match["offset"] or match["frac"]:
            raise TraceFormatError(path, line, f"unparsable TIMESTAMP {text!r}")
        offset_s = int(dt.utcoffset() // timedelta(seconds=1))
    seconds = (dt.replace(tzinfo=None, microsecond=0) - _EPOCH) // timedelta(seconds=1)
    frac_ns = int((match["frac"] or "").ljust(9, "0")) + dt.microsecond * 1000
    return (seconds - offset_s) * 10**9 + frac_ns


def _offset_s(path: PathLike, line: int, text: str, offset: str | None) -> int:
    """Seconds east of UTC of a TIMESTAMP's offset text (``Z``, ``±HH:MM``, ``±HHMM``)."""
    if offset is None or offset in ("Z", "z"):
        return 0
    hours, minutes = int(offset[1:3]), int(offset[-2:])
    if hours > 23 or minutes > 59:
        raise TraceFormatError(path, line, f"TIMESTAMP offset {offset!r} out of range in {text!r}")
    sign = -1 if offset[0] == "-" else 1
    return sign * (hours * 3600 + minutes * 60)


def read_azure_trace(
    path: PathLike,
    max_model_len: int = MAX_MODEL_LEN,
    limit: int | None = None,
    time_scale: float = 1.0,
    apply_filter: bool = True,
    max_prompt_len: int = MAX_PROMPT_LEN,
    sampling: SamplingParams | None = None,
    max_total_tokens: int | None = None,
) -> list[Request]:
    """Azure LLM-inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Patel et al., "Splitwise", ISCA 2024 (AzurePublicDataset, CC-BY 4.0). Timestamps are
    date-times, naive (2023 release, taken as UTC) or with a UTC offset (2024 release,
    ``+00:00``), see :func:`_timestamp_ns`; arrivals are seconds after the earliest one.
    """
    lines = read_text_lines(path)
    cols = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    parsed = [
        (
            ln,
            _timestamp_ns(path, ln, row["TIMESTAMP"]),
            _int(path, ln, "ContextTokens", row["ContextTokens"], exact=False),
            _int(path, ln, "GeneratedTokens", row["GeneratedTokens"], exact=False),
        )
        for ln, row in _csv_rows(path, lines, 1, cols)
    ]
    t0 = min((r[1] for r in parsed), default=0)
    rows = [(ln, (ns - t0) / 1e9, p, o) for ln, ns, p, o in parsed]
    return _to_requests(
        path, rows, time_scale, max_model_len, max_prompt_len, limit, apply_filter, sampling,
        max_total_tokens=max_total_tokens,
    )  # fmt: skip


def read_vidur_trace(
    path: PathLike,
    max_model_len: int = MAX_MODEL_LEN,
    limit: int | None = None,
    time_scale: float = 1.0,
    apply_filter: bool = True,
    max_prompt_len: int = MAX_PROMPT_LEN,
    sampling: SamplingParams | None = None,
    max_total_tokens: int | None = None,
) -> list[Request]:
    """Vidur request trace CSV (``arrived_at`` seconds, ``num_prefill_tokens``,
    ``num_decode_tokens``; other columns ignored). Integral floats (``12.0``) are accepted."""
    lines = read_text_lines(path)
    cols = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
    rows = [
        (
            ln,
            _float(path, ln, "arrived_at", row["arrived_at"]),
            _int(path, ln, "num_prefill_tokens", row["num_prefill_tokens"], exact=False),
            _int(path, ln, "num_decode_tokens", row["num_decode_tokens"], exact=False),
        )
        for ln, row in _csv_rows(path, lines, 1, cols)
    ]
    return _to_requests(
        path, rows, time_scale, max_model_len, max_prompt_len, limit, apply_filter, sampling,
        max_total_tokens=max_total_tokens,
    )  # fmt: skip


MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` entry in Mooncake's traces (and the traces made in its format)."""

_MIX = tuple(np.uint64(v) for v in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def hash_block_token_ids(
    hash_ids: Sequence[int], prompt_len: int, block_tokens: int, vocab_size: int
) -> tuple[int, ...]:
    """Stand-in prompt token ids for a prompt described by block hashes (Mooncake's
    ``hash_ids``): entry i covers tokens ``[i * block_tokens, (i + 1) * block_tokens)``, and
    each of its ids is a function of the hash id and the position in its block alone
    (splitmix64, modulo ``vocab_size``). Two prompts so hold the same ids exactly where their
    hash ids agree, and share in the prefix cache the leading blocks they share in the trace
    (two different hash ids agree on a 16-token block with probability vocab_size^-16)."""
    blocks = np.asarray(hash_ids, dtype=np.uint64)
    z = np.repeat(blocks * np.uint64(block_tokens), block_tokens)[:prompt_len]
    z = z + np.tile(np.arange(block_tokens, dtype=np.uint64), len(blocks))[:prompt_len]
    z = z + _MIX[0]
    z = (z ^ (z >> np.uint64(30))) * _MIX[1]
    z = (z ^ (z >> np.uint64(27))) * _MIX[2]
    z = z ^ (z >> np.uint64(31))
    return tuple((z % np.uint64(vocab_size)).astype(np.int64).tolist())


def _hash_ids(
    path: PathLike, line: int, obj: dict[str, Any], prompt: int, block: int
) -> tuple[int, ...]:
    """A row's ``hash_ids``, checked: whole numbers >= 0, one per ``block`` prompt tokens."""
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**63 for h in ids
    ):
        raise TraceFormatError(path, line, f"hash_ids is not a list of whole numbers >= 0: {ids!r}")
    need = -(-prompt // block)
    if len(ids) != need:
        raise TraceFormatError(
            path, line,
            f"hash_ids holds {len(ids)} block(s), but input_length {prompt} needs {need} of "
            f"{block} tokens (workload.hash_block_tokens: the trace's tokens per hash id)",
        )  # fmt: skip
    return tuple(ids)


def read_mooncake_blocks(
    path: PathLike,
    max_model_len: int = MAX_MODEL_LEN,
    limit: int | None = None,
    time_scale: float = 1.0,
    apply_filter: bool = True,
    max_prompt_len: int = MAX_PROMPT_LEN,
    sampling: SamplingParams | None = None,
    max_total_tokens: int | None = None,
    hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> tuple[list[Request], list[tuple[int, ...] | None]]:
    """:func:`read_mooncake_trace`'s requests without token ids, and each one's ``hash_ids``
    (indexed by request id; None for a row without them), so that a caller cuts its window
    before :func:`with_hash_token_ids` spends memory on the ids (a whole Mooncake trace holds
    about 180 million prompt tokens)."""
    if hash_block_tokens < 1:
        raise RequestError(f"hash_block_tokens must be >= 1, got {hash_block_tokens}")
    rows: list[tuple[int, float, int, int]] = []
    hashes: list[tuple[int, ...] | None] = []
    for line, obj in jsonl_objects(path, read_text_lines(path)):
        missing = [k for k in ("timestamp", "input_length", "output_length") if k not in obj]
        if missing:
            raise TraceFormatError(path, line, f"missing key(s) {', '.join(missing)}")
        for key in ("timestamp", "input_length", "output_length"):
            if isinstance(obj[key], bool) or not isinstance(obj[key], int | float):
                raise TraceFormatError(path, line, f"{key} is not a number: {obj[key]!r}")
        ms = _float(path, line, "timestamp", str(obj["timestamp"]))
        p = _int(path, line, "input_length", str(obj["input_length"]), exact=False)
        o = _int(path, line, "output_length", str(obj["output_length"]), exact=False)
        rows.append((line, ms / 1000.0, p, o))
        hashes.append(
            _hash_ids(path, line, obj, p, hash_block_tokens) if "hash_ids" in obj else None
        )
    t0 = min((r[1] for r in rows), default=0.0)
    rows = [(ln, t - t0, p, o) for ln, t, p, o in rows]
    kept: list[int] = []
    requests = _to_requests(
        path, rows, time_scale, max_model_len, max_prompt_len, limit, apply_filter, sampling,
        max_total_tokens=max_total_tokens, kept_rows=kept,
    )  # fmt: skip
    return requests, [hashes[k] for k in kept]


def with_hash_token_ids(
    requests: Iterable[Request],
    hashes: Sequence[tuple[int, ...] | None],
    hash_block_tokens: int,
    vocab_size: int,
) -> list[Request]:
    """``requests`` with the prompt token ids their ``hashes[request_id]`` stand for
    (:func:`hash_block_token_ids`); a request without hash ids keeps none."""
    out = []
    for r in requests:
        blocks = hashes[r.request_id]
        ids = None
        if blocks is not None:
            ids = hash_block_token_ids(blocks, r.prompt_len, hash_block_tokens, vocab_size)
        out.append(replace(r, prompt_token_ids=ids))
    return out


def read_mooncake_trace(
    path: PathLike,
    max_model_len: int = MAX_MODEL_LEN,
    limit: int | None = None,
    time_scale: float = 1.0,
    apply_filter: bool = True,
    max_prompt_len: int = MAX_PROMPT_LEN,
    sampling: SamplingParams | None = None,
    max_total_tokens: int | None = None,
    hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    vocab_size: int | None = None,
) -> list[Request]:
    """Mooncake JSONL: one object per line with ``timestamp`` (ms), ``input_length``,
    ``output_length`` and optionally ``hash_ids``, one id per ``hash_block_tokens`` prompt
    tokens (Mooncake's 512), equal ids standing for equal token blocks. With ``vocab_size``
    a row with ``hash_ids`` gets prompt token ids that share exactly those blocks
    (:func:`hash_block_token_ids`), so prefix caching finds the trace's shared prefixes;
    without it (None) no row carries ids. Other keys are ignored."""
    requests, hashes = read_mooncake_blocks(
        path, max_model_len, limit, time_scale, apply_filter, max_prompt_len, sampling,
        max_total_tokens, hash_block_tokens,
    )  # fmt: skip
    if vocab_size is None:
        return requests
    return with_hash_token_ids(requests, hashes, hash_block_tokens, vocab_size)


# ---------------------------------------------------------------- JSON datasets
