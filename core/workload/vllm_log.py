"""Real vLLM runs as workloads and as measurements.

A *run directory* (the layout of ``../shared/measurements/vllm/<run>/``) holds:

- ``requests.jsonl``: one object per request with ``input_toks``, ``output_toks`` and the
  engine-clock timestamps ``queued_ts``, ``first_token_ts``, ``last_token_ts`` and,
  optionally, ``scheduled_ts`` (NaN in :class:`LoggedRequest` when absent: the queue wait is
  then unknown); ``arrival_time`` is the client's wall clock, a different clock;
  ``request_id`` as ``vllm bench serve`` names requests, ``<prefix>-<row>``, gives each
  request's row in the workload that was sent;
- ``meta.json``: the resolved engine configuration (read by ``experiments.calibrate_vllm``).

Arrivals are ``queued_ts − min(queued_ts)`` (one clock with the other engine timestamps).
Measured latencies use the definitions of vLLM's benchmark: TTFT = ``first_token_ts −
queued_ts``, TPOT = ``(last_token_ts − first_token_ts) / (output_toks − 1)``, E2E =
``last_token_ts − queued_ts``. Token ids come from the workload JSONL that was sent (one
object per line with ``input_tok_ids``), matched by the row in each ``request_id`` when every
request has a distinct one, else by the log's order, so prefix-cache hits replay.

``vllm bench serve --save-result --save-detailed`` JSON is read as far as it allows: it
has per-request ``input_lens``, ``output_lens``, ``ttfts`` and ``itls``; current vLLM also
saves ``start_times`` (each request's send time on the client's clock), which give the
arrivals; older files have only ``request_rate`` and ``burstiness``, so arrivals must be
redrawn. A failed request has ``output_lens`` 0 (or ``successes`` false where saved). There
are no queueing or scheduling timestamps, no end-to-end times other than TTFT + sum(ITL),
and no token ids (prompts are not saved). A file written with ``--append-result`` holds one
JSON object per run; it is refused with a line saying how many, since which run to replay
is the user's choice.

Malformed input raises :class:`~core.workload.trace_io.TraceFormatError` naming the file,
the line and the key: missing fields, negative durations (a timestamp before the one it
follows), a ``request_id`` already on an earlier line (a duplicated line or id), clocks that
do not align (``arrival_time − queued_ts`` more than ``CLOCK_TOLERANCE_S`` from its median
over the requests means the two clocks cannot be one offset apart; the line named is the
one farthest from the median), and engine timestamps that are not on one clock. The run's
duration (meta.json's ``started_at`` to ``finished_at``, else ``timeseries.csv``'s last
``t`` plus a tick) plus ``CLOCK_TOLERANCE_S`` bounds both how far a ``queued_ts`` may lie
from their median and how long after the first ``queued_ts`` any timestamp may come; a run
that records no duration is bounded by ``SECONDS_PER_TOKEN_BOUND`` for each token of the
run (input and output, all requests) — an engine serving every token of the run one after
another at that pace would still be done by then — around the median ``queued_ts``, and
after the last one. The line named is the ``queued_ts`` farthest from the median, else the
one that ends last, the key its first timestamp past the bound. A log with fewer lines
than meta.json's ``num_requests`` gives a warning (the run may have been cut). A bench
result's ``start_times`` must span no more than its ``duration`` (plus
``CLOCK_TOLERANCE_S``); a logged request may not produce more than its workload row's
``output_toks``.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import logging
import math
import re
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.request import Request, SamplingParams
from core.workload.trace_io import TraceFormatError, jsonl_objects, jsonl_values, read_text_lines

REQUIRED = ("input_toks", "output_toks", "queued_ts", "first_token_ts", "last_token_ts")
ORDER = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
# Client-to-engine delay varies by request (HTTP, tokenization); the shared run's spread is
# ~0.16 s (../shared/measurements/README.md). A spread of more than this means the
# timestamps are not on two clocks one offset apart.
CLOCK_TOLERANCE_S = 5.0
# Seconds per token of the run (input and output, all requests, one after another) that
# bound how long after the last queued_ts the run may end on one clock: the shared run's
# engine needed 0.0004 s (../shared/measurements/vllm/rtx4090-llama-3.1-8b/requests.jsonl:
# 184 s for 452,992 tokens), 25,000 times less; engine timestamps moved to another clock
# (e.g. from the monotonic clock to the epoch) are ~1.7e9 s off, caught in runs of up to
# ~1.7e8 tokens.
SECONDS_PER_TOKEN_BOUND = 10.0
_ROW_ID = re.compile(r"-(\d+)$")
log = logging.getLogger(__name__)
_JSON_SPACE = re.compile(r"[ \t\n\r]*")


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    """One request as vLLM recorded it; times in seconds from the first ``queued_ts``
    (``scheduled`` NaN when the log lacks ``scheduled_ts``); ``row`` is its row in the
    workload that was sent (see the module doc)."""

    index: int
    prompt_len: int
    output_len: int
    arrival: float
    scheduled: float
    first_token: float
    last_token: float
    row: int

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.last_token - self.arrival

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first; NaN for one-token outputs."""
        if self.output_len < 2:
            return math.nan
        return (self.last_token - self.first_token) / (self.output_len - 1)

    @property
    def queue_wait(self) -> float:
        """Arrival to first scheduling; NaN when ``scheduled_ts`` was not logged."""
        return self.scheduled - self.arrival


def _number(path: Path, line: int, obj: dict[str, Any], key: str) -> float:
    value = obj.get(key)
    if value is None:
        raise TraceFormatError(path, line, f"missing key {key!r}")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TraceFormatError(path, line, f"{key} is not a finite number: {value!r}")
    return float(value)


def read_vllm_log(run_dir: str | Path) -> list[LoggedRequest]:
    """The requests of ``run_dir/requests.jsonl`` (or that file itself), in file order,
    checked as the module doc says; the run's ``meta.json`` and ``timeseries.csv`` beside
    the file give its duration (:func:`run_duration`), and a log with fewer lines than
    meta.json's ``num_requests`` gives a warning (the run may have been cut)."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / "requests.jsonl"
    if not path.is_file():
        raise TraceFormatError(
            path, "file", "not found (a vLLM run directory holds requests.jsonl)"
        )
    raw = list(jsonl_objects(path, read_text_lines(path)))
    if not raw:
        raise TraceFormatError(path, "file", "no requests")
    rows, offsets = _parse_rows(path, raw)
    _check_unique_ids(path, rows)
    _check_clocks(path, offsets)
    meta = run_meta(path.parent)
    _check_one_clock(path, rows, run_duration(path.parent, meta))
    _check_count(path, len(rows), meta)
    t0 = min(v["queued_ts"] for _, v, _ in rows)
    source_rows = _source_rows([rid for _, _, rid in rows])
    return [
        LoggedRequest(
            i,
            int(v["input_toks"]),
            int(v["output_toks"]),
            v["queued_ts"] - t0,
            v.get("scheduled_ts", math.nan) - t0,
            v["first_token_ts"] - t0,
            v["last_token_ts"] - t0,
            source_rows[i],
        )
        for i, (_, v, _) in enumerate(rows)
    ]


_Row = tuple[int, dict[str, float], Any]  # (line, the numbers of REQUIRED and ORDER, id)


def _parse_rows(
    path: Path, raw: list[tuple[int, dict[str, Any]]]
) -> tuple[list[_Row], list[tuple[int, float]]]:
    """Each line's numbers (lengths positive integers, timestamps in ``ORDER``) and its
    ``request_id``; the ``arrival_time − queued_ts`` of the lines that have one."""
    rows: list[_Row] = []
    offsets = []
    for line, obj in raw:
        vals = {k: _number(path, line, obj, k) for k in REQUIRED}
        if "scheduled_ts" in obj:
            vals["scheduled_ts"] = _number(path, line, obj, "scheduled_ts")
        for key in ("input_toks", "output_toks"):
            if vals[key] < 1 or vals[key] != int(vals[key]):
                raise TraceFormatError(path, line, f"{key} must be a positive integer")
        order = [k for k in ORDER if k in vals]
        for before, after in itertools.pairwise(order):
            if vals[after] < vals[before]:
                raise TraceFormatError(
                    path,
                    line,
                    f"negative duration: {after} {vals[after]} < {before} {vals[before]}",
                )
        if "arrival_time" in obj:
            offsets.append((line, _number(path, line, obj, "arrival_time") - vals["queued_ts"]))
        rows.append((line, vals, obj.get("request_id")))
    return rows, offsets


def _check_unique_ids(path: Path, rows: list[_Row]) -> None:
    """No two lines share a ``request_id`` (a duplicated line or id); the error names the
    later line and the earlier one."""
    seen: dict[str, int] = {}
    for line, _, rid in rows:
        if rid is None:
            continue
        key = json.dumps(rid, sort_keys=True)
        if key in seen:
            raise TraceFormatError(path, line, f"request_id {rid!r} already on line {seen[key]}")
        seen[key] = line


def run_meta(run_dir: Path) -> dict[str, Any] | None:
    """``run_dir/meta.json`` when it is a JSON object; None when it is missing or is not
    one (its reader, :func:`experiments.lib.vllm_run.read_run`, refuses that by name)."""
    try:
        meta = json.loads((run_dir / "meta.json").read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return meta if isinstance(meta, dict) else None


def run_duration(run_dir: Path, meta: dict[str, Any] | None) -> tuple[float, str] | None:
    """How long the run in ``run_dir`` lasted (seconds) and where that was read: meta.json's
    ``started_at`` to ``finished_at`` (ISO 8601) when it has both, else ``timeseries.csv``'s
    last ``t`` plus its longest tick (the run ended before the next sample); None when
    neither is recorded. A value that is not a time is an error naming the file and key."""
    if meta is not None and None not in (meta.get("started_at"), meta.get("finished_at")):
        meta_path = run_dir / "meta.json"
        start = _meta_time(meta_path, meta, "started_at")
        end = _meta_time(meta_path, meta, "finished_at")
        seconds = (end - start).total_seconds()
        if seconds < 0:
            raise TraceFormatError(meta_path, "key 'finished_at'", "before started_at")
        return seconds, "meta.json's started_at to finished_at"
    return _timeseries_duration(run_dir / "timeseries.csv")


def _meta_time(meta_path: Path, meta: dict[str, Any], key: str) -> datetime:
    """meta.json's ``key`` as an ISO 8601 time (UTC when it names no zone)."""
    value = meta.get(key)
    try:
        when = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        when = None
    if when is None:
        raise TraceFormatError(meta_path, f"key {key!r}", f"{value!r} is not an ISO 8601 time")
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _timeseries_duration(ts_path: Path) -> tuple[float, str] | None:
    """``timeseries.csv``'s last ``t`` plus its longest tick; None without the file, a
    ``t`` column or two samples. A ``t`` that is not a number is an error naming the line."""
    if not ts_path.is_file():
        return None
    try:
        lines = ts_path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError):
        return None  # read_run names the file
    table = list(csv.reader(lines))
    if not table or "t" not in [h.strip() for h in table[0]]:
        return None
    column = [h.strip() for h in table[0]].index("t")
    times = []
    for line, fields in enumerate(table[1:], start=2):
        if not fields or column >= len(fields):
            continue
        try:
            times.append(float(fields[column]))
        except ValueError:
            raise TraceFormatError(
                ts_path, line, f"t is {fields[column]!r}, not a number"
            ) from None
    if len(times) < 2 or not all(map(math.isfinite, times)):
        return None
    tick = max(b - a for a, b in itertools.pairwise(times))
    return max(times) + max(tick, 0.0), "timeseries.csv's last t plus one tick"


def _check_count(path: Path, count: int, meta: dict[str, Any] | None) -> None:
    """A warning when the log holds fewer requests than meta.json's ``num_requests``."""
    wanted = None if meta is None else meta.get("num_requests")
    if wanted is None:
        return
    ok = isinstance(wanted, int | float) and not isinstance(wanted, bool)
    if not ok or not math.isfinite(wanted) or wanted != int(wanted) or wanted < 0:
        raise TraceFormatError(
            path.parent / "meta.json", "key 'num_requests'", f"{wanted!r} is not a whole number"
        )
    if count < wanted:
        log.warning(
            "%s: %d requests, but meta.json's num_requests is %d: the run may have been cut "
            "(the log's last lines lost?)", path, count, int(wanted),
        )  # fmt: skip


def _check_clocks(path: Path, offsets: list[tuple[int, float]]) -> None:
    """``arrival_time − queued_ts`` must stay within ``CLOCK_TOLERANCE_S`` of its median;
    the error names the line farthest from it."""
    if not offsets:
        return
    middle = statistics.median_low(o for _, o in offsets)
    line, worst = max(offsets, key=lambda o: abs(o[1] - middle))
    if abs(worst - middle) > CLOCK_TOLERANCE_S:
        raise TraceFormatError(
            path, line, f"clocks do not align: arrival_time - queued_ts is {worst:.3f} s "
            f"here but {middle:.3f} s over the file (median; more than "
            f"{CLOCK_TOLERANCE_S} s apart)",
        )  # fmt: skip


def _check_one_clock(path: Path, rows: list[_Row], duration: tuple[float, str] | None) -> None:
    """Every engine timestamp lies on the clock of the file's ``queued_ts``. The limit is
    the run's ``duration`` plus ``CLOCK_TOLERANCE_S`` (the client's clock timed the run)
    when known, else ``SECONDS_PER_TOKEN_BOUND`` per token of the run. First no
    ``queued_ts`` is further than the limit from their median (the error names the line
    farthest from it); then none of a line's timestamps is later than the first
    ``queued_ts`` plus the limit (plus the span of ``queued_ts`` when the duration is
    unknown): the error names the line that ends last and its first timestamp past that.
    Timestamps before their own ``queued_ts`` are negative durations, refused already."""
    tokens = int(sum(v["input_toks"] + v["output_toks"] for _, v, _ in rows))
    if duration is None:
        limit = tokens * SECONDS_PER_TOKEN_BOUND
        why = f"{SECONDS_PER_TOKEN_BOUND:g} s for each of the run's {tokens} tokens"
    else:
        limit = duration[0] + CLOCK_TOLERANCE_S
        why = f"the run lasted {duration[0]:.4g} s, {duration[1]}, plus {CLOCK_TOLERANCE_S:g} s"
    _check_queued(path, rows, limit, why)
    queued = [v["queued_ts"] for _, v, _ in rows]
    start, span = min(queued), max(queued) - min(queued)
    bound = limit if duration is not None else span + limit
    line, worst, _ = max(rows, key=lambda r: r[1]["last_token_ts"])  # each row's latest
    if worst["last_token_ts"] - start <= bound:
        return
    key = next(k for k in ORDER[1:] if k in worst and worst[k] - start > bound)
    if duration is None:
        why = f"the span of queued_ts, {span:.4g} s, plus {why}"
    raise TraceFormatError(
        path, line, f"engine timestamps on two clocks: {key} {worst[key]:.3f} is "
        f"{worst[key] - start:.4g} s after the first queued_ts {start:.3f}, but on one clock "
        f"the run ends within {bound:.4g} s of it ({why})",
    )  # fmt: skip


def _check_queued(path: Path, rows: list[_Row], limit: float, why: str) -> None:
    """No ``queued_ts`` more than ``limit`` seconds from the median of the file's (``why``
    says where the limit comes from); the error names the line farthest from it."""
    middle = statistics.median_low(v["queued_ts"] for _, v, _ in rows)
    line, worst, _ = max(rows, key=lambda r: abs(r[1]["queued_ts"] - middle))
    off = worst["queued_ts"] - middle
    if abs(off) > limit:
        raise TraceFormatError(
            path, line, f"queued_ts on another clock: {worst['queued_ts']:.3f} is {off:+.4g} s "
            f"from the file's median queued_ts {middle:.3f}, but on one clock every request "
            f"arrives within {limit:.4g} s of it ({why})",
        )  # fmt: skip


def _source_rows(request_ids: list[Any]) -> list[int]:
    """Each request's row in the workload sent: the ``<row>`` of ``<prefix>-<row>`` ids
    when every request has one and no two share it, else the log's order."""
    found = [_ROW_ID.search(r) if isinstance(r, str) else None for r in request_ids]
    if all(found):
        numbers = [int(m.group(1)) for m in found if m]
        if len(set(numbers)) == len(numbers):
            return numbers
        log.warning("two logged requests share a <prefix>-<row> id: token ids are matched "
                    "to the workload's rows in the log's order")  # fmt: skip
    elif any(found):
        log.warning("not every logged request id ends in -<row>: token ids are matched to "
                    "the workload's rows in the log's order")  # fmt: skip
    return list(range(len(request_ids)))


def read_token_ids(path: str | Path, logged: list[LoggedRequest]) -> list[tuple[int, ...]]:
    """``input_tok_ids`` of each logged request (in ``logged``'s order), from the workload
    JSONL's row ``request.row``: whole numbers >= 0 (not booleans), as many as the logged
    prompt length. A row's ``output_toks``, where it has one, is the most the request may
    produce: a logged request that produced more is an error (not the workload that was
    sent); fewer gives one warning for the file (a run sent without ``ignore_eos`` stops
    early; this project's runs use it, so every request produces what it asked for)."""
    path = Path(path)
    if not path.is_file():
        raise TraceFormatError(path, "file", "not found")
    rows: list[tuple[int, tuple[int, ...], Any]] = []  # (line, ids, output_toks) per row
    for line, obj in jsonl_values(path, read_text_lines(path)):
        ids = obj.get("input_tok_ids") if isinstance(obj, dict) else None
        if not isinstance(ids, list):
            raise TraceFormatError(path, line, "missing key 'input_tok_ids' (a list of ints)")
        bad = next((i for i, t in enumerate(ids) if not _is_token_id(t)), None)
        if bad is not None:
            raise TraceFormatError(
                path, line, f"input_tok_ids[{bad}] is {ids[bad]!r}, not a token id (a whole "
                "number >= 0)",
            )  # fmt: skip
        rows.append((line, tuple(ids), obj.get("output_toks")))
    out = [_logged_ids(path, rows, r) for r in logged]
    short = [r for r in logged if isinstance(rows[r.row][2], int) and r.output_len < rows[r.row][2]]
    if short:
        log.warning(
            "%s: %d of %d logged requests produced fewer tokens than their row's output_toks "
            "(first: request %d, line %d): the run was sent without ignore_eos, or with "
            "another workload", path, len(short), len(logged), short[0].index,
            rows[short[0].row][0],
        )  # fmt: skip
    return out


def _is_token_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def _logged_ids(
    path: Path, rows: list[tuple[int, tuple[int, ...], Any]], r: LoggedRequest
) -> tuple[int, ...]:
    """Row ``r.row``'s ids, checked against ``r``'s logged lengths (errors name the
    workload file's line and the log's request)."""
    if r.row >= len(rows):
        raise TraceFormatError(
            path, "file", f"{len(rows)} requests, but the log's request {r.index} "
            f"needs row {r.row} (rows count from 0)",
        )  # fmt: skip
    line, ids, output = rows[r.row]
    if len(ids) != r.prompt_len:
        raise TraceFormatError(
            path, line, f"{len(ids)} input_tok_ids but the log's input_toks is "
            f"{r.prompt_len} (request {r.index} of the log, row {r.row})",
        )  # fmt: skip
    if isinstance(output, int) and output < r.output_len:
        raise TraceFormatError(
            path, line, f"output_toks {output!r} but the log's output_toks is {r.output_len} "
            f"(request {r.index} of the log, row {r.row}): more than it asked for, so not "
            "the workload that was sent",
        )  # fmt: skip
    return ids


def check_dataset_hash(workload: str | Path, meta: dict[str, Any], meta_path: Path) -> None:
    """A warning when meta.json's ``dataset_hash`` (the sha256 of the workload file that
    was sent) is not the sha256 of ``workload``: its prompts may not be the run's (the file
    may also just be re-serialized, so it is not an error). Nothing when meta.json has no
    ``dataset_hash``; one that is not a string is an error naming the key."""
    recorded = meta.get("dataset_hash")
    if recorded is None:
        return
    if not isinstance(recorded, str):
        raise TraceFormatError(meta_path, "key 'dataset_hash'", f"{recorded!r} is not a string")
    digest = hashlib.sha256(Path(workload).read_bytes()).hexdigest()
    if digest != recorded.strip().lower().removeprefix("sha256:"):
        log.warning(
            "%s: sha256 %s is not %s's dataset_hash %s: the workload may not be the one the "
            "run sent (or was re-serialized)", workload, digest, meta_path, recorded,
        )  # fmt: skip


def requests_from_log(
    logged: list[LoggedRequest],
    token_ids: list[tuple[int, ...]] | None = None,
    sampling: SamplingParams | None = None,
) -> list[Request]:
    """Requests replaying the logged arrivals and lengths (and ``token_ids[k]`` for
    ``logged[k]`` when given), sorted by arrival; ``request_id`` is the log's order."""
    sampling = sampling or SamplingParams()
    reqs = [
        Request(
            r.index,
            r.arrival,
            r.prompt_len,
            r.output_len,
            sampling,
            None if token_ids is None else token_ids[k],
        )
        for k, r in enumerate(logged)
    ]
    return sorted(reqs, key=lambda q: (q.arrival_time, q.request_id))


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
        text = path.read_text(encoding="utf-8-sig")
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
