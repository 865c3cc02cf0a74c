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
than meta.json's ``num_requests`` gives a warning (the run may have been cut). A logged
request may not produce more than its workload row's ``output_toks``.

``vllm bench serve`` result JSON (the ``vllm_bench`` workload) is read by
:mod:`core.workload.vllm_bench`.
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
        why = f"{key} is null" if key in obj else f"missing key {key!r}"
        raise TraceFormatError(path, line, why)
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
