"""``vllm bench serve --save-result --save-detailed`` result JSON, read as far as it allows.

It has per-request ``input_lens``, ``output_lens``, ``ttfts`` and ``itls``; current vLLM also
saves ``start_times`` (each request's send time on the client's clock), which give the
arrivals; older files have only ``request_rate`` and ``burstiness``, so arrivals must be
redrawn. A failed request has ``output_lens`` 0 (or ``successes`` false where saved). There
are no queueing or scheduling timestamps, no end-to-end times other than TTFT + sum(ITL),
and no token ids (prompts are not saved). A file written with ``--append-result`` holds one
JSON object per run; it is refused with a line saying how many, since which run to replay
is the user's choice.

Malformed input raises :class:`~core.workload.trace_io.TraceFormatError` naming the file and
the key. ``start_times`` must span no more than the run's ``duration`` (plus
:data:`~core.workload.vllm_log.CLOCK_TOLERANCE_S`). A run directory of vLLM's own logs (the
``vllm_log`` workload) is read by :mod:`core.workload.vllm_log`.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.workload.trace_io import TraceFormatError, refuse_compressed
from core.workload.vllm_log import CLOCK_TOLERANCE_S

_JSON_SPACE = re.compile(r"[ \t\n\r]*")


@dataclass(frozen=True, slots=True)
class BenchResult:
    """What ``vllm bench serve --save-result --save-detailed`` JSON holds per request;
    ``start_times`` (send times, seconds) and ``successes`` are None when not saved;
    ``request_rate`` None is inf, or absent when ``rate_saved`` is False."""

    input_lens: list[int]
    output_lens: list[int]
    ttfts: list[float]
    itls: list[list[float]]
    request_rate: float | None
    burstiness: float
    duration: float | None
    start_times: list[float] | None = None
    successes: list[bool] | None = None
    rate_saved: bool = True  # whether the file has a request_rate (None: it is inf)


def read_bench_result(path: str | Path) -> BenchResult:
    """Parse a ``vllm bench serve --save-detailed`` result JSON (see the module doc for
    what it lacks); errors name the key."""
    path = Path(path)
    doc = _bench_doc(path)
    for key in ("input_lens", "output_lens", "ttfts"):
        if not isinstance(doc.get(key), list):
            raise TraceFormatError(
                path, f"key {key!r}", "missing (was the run saved with --save-detailed?)"
            )
    n = _bench_count(path, doc)
    rate = doc.get("request_rate")
    if rate in (None, "inf") or rate == math.inf:
        rate = None
    else:
        rate = _bench_number(path, "request_rate", rate, positive=True)
    itls = doc.get("itls")
    if itls is None:
        itls = [[] for _ in range(n)]
    if not isinstance(itls, list) or len(itls) != n or not all(isinstance(x, list) for x in itls):
        raise TraceFormatError(path, "key 'itls'", f"expected {n} lists of numbers")
    burstiness = doc.get("burstiness")
    duration = doc.get("duration")
    duration = None if duration is None else _bench_number(path, "duration", duration)
    return BenchResult(
        _bench_ints(path, "input_lens", doc["input_lens"]),
        _bench_ints(path, "output_lens", doc["output_lens"]),
        [_bench_number(path, f"ttfts[{i}]", x) for i, x in enumerate(doc["ttfts"])],
        [[_bench_number(path, f"itls[{i}]", t) for t in x] for i, x in enumerate(itls)],
        rate,
        1.0 if burstiness is None else _bench_number(path, "burstiness", burstiness, True),
        duration,
        _start_times(path, doc.get("start_times"), n, duration),
        _successes(path, doc.get("successes"), n),
        "request_rate" in doc,
    )


_PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "successes")


def _bench_count(path: Path, doc: dict[str, Any]) -> int:
    """The number of requests: the length most of the per-request lists share (ties: the
    first's in ``_PER_REQUEST``); a list of another length is an error naming it. An empty
    file (no requests) is an error too."""
    lengths = {k: len(doc[k]) for k in _PER_REQUEST if isinstance(doc.get(k), list)}
    n = Counter(lengths.values()).most_common(1)[0][0]
    for key, length in lengths.items():
        if length != n:
            others = ", ".join(k for k, m in lengths.items() if m == n)
            raise TraceFormatError(path, f"key {key!r}", f"{length} entries, but {others} have {n}")
    if n == 0:
        raise TraceFormatError(path, "file", f"no requests ({', '.join(lengths)} are empty)")
    return n


def _bench_doc(path: Path) -> dict[str, Any]:
    """The one JSON object of a bench result file; a file of several (``--append-result``)
    is refused with a line saying how many and how to keep one."""
    try:
        data = path.read_bytes()
        refuse_compressed(path, data)
        text = data.decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceFormatError(path, "file", f"not a readable JSON file ({e})") from None
    docs = _json_documents(path, text)
    if len(docs) > 1:
        raise TraceFormatError(
            path, "file", f"holds {len(docs)} results (one JSON object per run, as "
            f"--append-result writes them); copy the run to replay into its own file, e.g. "
            f"the last: tail -n 1 {path} > one.json",
        )  # fmt: skip
    if not docs or not isinstance(docs[0], dict):
        raise TraceFormatError(path, "file", "expected a JSON object")
    return docs[0]


def _json_documents(path: Path, text: str) -> list[Any]:
    """The JSON values written one after another in ``text`` (whitespace between them)."""
    decoder = json.JSONDecoder()
    docs: list[Any] = []
    pos = _JSON_SPACE.match(text).end()
    while pos < len(text):
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise TraceFormatError(path, "file", f"not a readable JSON file ({e})") from None
        docs.append(value)
        pos = _JSON_SPACE.match(text, end).end()
    return docs


def _per_request(
    path: Path, key: str, values: Any, n: int, valid: Callable[[Any], bool], what: str
) -> list[Any] | None:
    """The optional list ``key`` of a bench result: None when absent, else ``n`` values each
    ``valid`` (``what`` says what one is, for the error naming the file and index)."""
    if values is None:
        return None
    if not isinstance(values, list) or len(values) != n:
        raise TraceFormatError(path, f"key '{key}'", f"expected {n} {what}s, one a request")
    for i, v in enumerate(values):
        if not valid(v):
            raise TraceFormatError(path, f"key '{key}[{i}]'", f"{v!r} is not a {what}")
    return list(values)


def _is_finite_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _start_times(path: Path, values: Any, n: int, duration: float | None) -> list[float] | None:
    """``start_times``: None when absent, else ``n`` finite numbers (any clock origin, in
    seconds) spanning no more than the run's ``duration``, when the file has one, plus
    ``CLOCK_TOLERANCE_S`` (the duration is timed apart from the send times): every request
    was sent while the run lasted. The error names the entry farthest from the median (one
    on another clock or in other units)."""
    times = _per_request(path, "start_times", values, n, _is_finite_number, "finite number")
    if times is None:
        return None
    times = [float(v) for v in times]
    span = max(times) - min(times) if times else 0.0
    if duration is not None and span > duration + CLOCK_TOLERANCE_S:
        middle = statistics.median_low(times)
        i = max(range(len(times)), key=lambda k: abs(times[k] - middle))
        raise TraceFormatError(
            path, f"key 'start_times[{i}]'", f"{times[i]!r} is {times[i] - middle:+.4g} s from "
            f"the median start time {middle!r}: start_times span {span:.4g} s, but the run "
            f"lasted {duration:g} s (its duration; plus {CLOCK_TOLERANCE_S:g} s): not on the "
            "others' clock",
        )  # fmt: skip
    return times


def _successes(path: Path, values: Any, n: int) -> list[bool] | None:
    """``successes``: None when absent, else ``n`` booleans."""
    return _per_request(path, "successes", values, n, lambda v: isinstance(v, bool), "boolean")


def _bench_number(path: Path, key: str, value: Any, positive: bool = False) -> float:
    """A finite number ≥ 0 (> 0 with ``positive``) at ``key`` of a bench result."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0 or (positive and value == 0):
        want = "a positive number" if positive else "a finite number >= 0"
        raise TraceFormatError(path, f"key {key!r}", f"{value!r} is not {want}")
    return float(value)


def _bench_ints(path: Path, key: str, values: list[Any]) -> list[int]:
    """Whole numbers ≥ 0 (a length of 0 is a failed request, dropped later)."""
    for i, v in enumerate(values):
        number = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        if not number or v != int(v) or v < 0:
            raise TraceFormatError(path, f"key '{key}[{i}]'", f"{v!r} is not a whole number >= 0")
    return [int(v) for v in values]
