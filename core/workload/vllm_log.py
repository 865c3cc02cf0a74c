"""Real vLLM runs as workloads and as measurements.

A *run directory* (the layout of ``../shared/measurements/vllm/<run>/``) holds:

- ``requests.jsonl``: one object per request with ``input_toks``, ``output_toks`` and the
  engine-clock timestamps ``queued_ts``, ``scheduled_ts``, ``first_token_ts``,
  ``last_token_ts`` (``arrival_time`` is the client's wall clock, a different clock);
- ``meta.json``: the resolved engine configuration (read by ``experiments.calibrate_vllm``).

Arrivals are ``queued_ts − min(queued_ts)`` (one clock with the other engine timestamps).
Measured latencies use the definitions of vLLM's benchmark: TTFT = ``first_token_ts −
queued_ts``, TPOT = ``(last_token_ts − first_token_ts) / (output_toks − 1)``, E2E =
``last_token_ts − queued_ts``. Token ids come from the workload JSONL that was sent (one
object per line with ``input_tok_ids``, in request order), so prefix-cache hits replay.

``vllm bench serve --save-result --save-detailed`` JSON is read as far as it allows: it
has per-request ``input_lens``, ``output_lens``, ``ttfts`` and ``itls`` but no arrival
times (only ``request_rate`` and ``burstiness``, so arrivals must be redrawn), no
queueing or scheduling timestamps, no end-to-end times other than TTFT + sum(ITL), and
no token ids (prompts are not saved).

Malformed input raises :class:`~core.workload.trace_io.TraceFormatError` naming the file,
the line and the key: missing fields, negative durations (a timestamp before the one it
follows), and clocks that do not align (``arrival_time − queued_ts`` drifting by more than
``CLOCK_TOLERANCE_S`` across requests means the two clocks cannot be one offset apart).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.request import Request, SamplingParams
from core.workload.trace_io import TraceFormatError, jsonl_objects, jsonl_values

REQUIRED = ("input_toks", "output_toks", "queued_ts", "first_token_ts", "last_token_ts")
# Client-to-engine delay varies by request (HTTP, tokenization); the shared run's spread is
# ~0.16 s (../shared/measurements/README.md). A spread of more than this means the
# timestamps are not on two clocks one offset apart.
CLOCK_TOLERANCE_S = 5.0


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    """One request as vLLM recorded it; times in seconds from the first ``queued_ts``."""

    index: int
    prompt_len: int
    output_len: int
    arrival: float
    scheduled: float
    first_token: float
    last_token: float

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
        return self.scheduled - self.arrival


def _number(path: Path, line: int, obj: dict[str, Any], key: str) -> float:
    value = obj.get(key)
    if value is None:
        raise TraceFormatError(path, line, f"missing key {key!r}")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TraceFormatError(path, line, f"{key} is not a finite number: {value!r}")
    return float(value)


def read_vllm_log(run_dir: str | Path) -> list[LoggedRequest]:
    """The requests of ``run_dir/requests.jsonl`` (or that file itself), in file order."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / "requests.jsonl"
    if not path.is_file():
        raise TraceFormatError(
            path, "file", "not found (a vLLM run directory holds requests.jsonl)"
        )
    raw = list(jsonl_objects(path, path.read_text(encoding="utf-8").splitlines()))
    if not raw:
        raise TraceFormatError(path, "file", "no requests")
    rows = []
    offsets = []
    for line, obj in raw:
        vals = {k: _number(path, line, obj, k) for k in REQUIRED}
        vals["scheduled_ts"] = (
            _number(path, line, obj, "scheduled_ts") if "scheduled_ts" in obj else vals["queued_ts"]
        )
        for key in ("input_toks", "output_toks"):
            if vals[key] < 1 or vals[key] != int(vals[key]):
                raise TraceFormatError(path, line, f"{key} must be a positive integer")
        order = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
        for before, after in itertools.pairwise(order):
            if vals[after] < vals[before]:
                raise TraceFormatError(
                    path,
                    line,
                    f"negative duration: {after} {vals[after]} < {before} {vals[before]}",
                )
        if "arrival_time" in obj:
            offsets.append((line, _number(path, line, obj, "arrival_time") - vals["queued_ts"]))
        rows.append((line, vals))
    if offsets:
        low, high = min(offsets, key=lambda o: o[1]), max(offsets, key=lambda o: o[1])
        if high[1] - low[1] > CLOCK_TOLERANCE_S:
            raise TraceFormatError(
                path, high[0], f"clocks do not align: arrival_time - queued_ts is "
                f"{high[1]:.3f} s here but {low[1]:.3f} s on line {low[0]} "
                f"(more than {CLOCK_TOLERANCE_S} s apart)",
            )  # fmt: skip
    t0 = min(v["queued_ts"] for _, v in rows)
    return [
        LoggedRequest(
            i,
            int(v["input_toks"]),
            int(v["output_toks"]),
            v["queued_ts"] - t0,
            v["scheduled_ts"] - t0,
            v["first_token_ts"] - t0,
            v["last_token_ts"] - t0,
        )
        for i, (_, v) in enumerate(rows)
    ]


def read_token_ids(path: str | Path, expected_lens: list[int]) -> list[tuple[int, ...]]:
    """``input_tok_ids`` of each line of a workload JSONL, checked against the logged
    prompt lengths (same order)."""
    path = Path(path)
    if not path.is_file():
        raise TraceFormatError(path, "file", "not found")
    out: list[tuple[int, ...]] = []
    for line, obj in jsonl_values(path, path.read_text(encoding="utf-8").splitlines()):
        ids = obj.get("input_tok_ids") if isinstance(obj, dict) else None
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise TraceFormatError(path, line, "missing key 'input_tok_ids' (a list of ints)")
        k = len(out)
        if k < len(expected_lens) and len(ids) != expected_lens[k]:
            raise TraceFormatError(
                path,
                line,
                f"{len(ids)} input_tok_ids but the log's input_toks is {expected_lens[k]}",
            )
        out.append(tuple(ids))
    if len(out) < len(expected_lens):
        raise TraceFormatError(
            path, "file", f"{len(out)} requests, fewer than the log's {len(expected_lens)}"
        )
    return out[: len(expected_lens)]


def requests_from_log(
    logged: list[LoggedRequest],
    token_ids: list[tuple[int, ...]] | None = None,
    sampling: SamplingParams | None = None,
) -> list[Request]:
    """Requests replaying the logged arrivals and lengths (and token ids when given),
    sorted by arrival; ``request_id`` is the log's order."""
    sampling = sampling or SamplingParams()
    reqs = [
        Request(
            r.index,
            r.arrival,
            r.prompt_len,
            r.output_len,
            sampling,
            None if token_ids is None else token_ids[r.index],
        )
        for r in logged
    ]
    return sorted(reqs, key=lambda q: (q.arrival_time, q.request_id))


@dataclass(frozen=True, slots=True)
class BenchResult:
    """What ``vllm bench serve --save-result --save-detailed`` JSON holds per request."""

    input_lens: list[int]
    output_lens: list[int]
    ttfts: list[float]
    itls: list[list[float]]
    request_rate: float | None
    burstiness: float
    duration: float | None


def read_bench_result(path: str | Path) -> BenchResult:
    """Parse a ``vllm bench serve --save-detailed`` result JSON (see the module doc for
    what it lacks); errors name the key."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise TraceFormatError(path, "file", f"not a readable JSON file ({e})") from None
    if not isinstance(doc, dict):
        raise TraceFormatError(path, "file", "expected a JSON object")
    for key in ("input_lens", "output_lens", "ttfts"):
        if not isinstance(doc.get(key), list):
            raise TraceFormatError(
                path, f"key {key!r}", "missing (was the run saved with --save-detailed?)"
            )
    n = len(doc["input_lens"])
    for key in ("output_lens", "ttfts"):
        if len(doc[key]) != n:
            raise TraceFormatError(path, f"key {key!r}", f"{len(doc[key])} entries, not {n}")
    rate = doc.get("request_rate")
    rate = None if rate in (None, "inf") or rate == math.inf else float(rate)
    return BenchResult(
        [int(x) for x in doc["input_lens"]],
        [int(x) for x in doc["output_lens"]],
        [float(x) for x in doc["ttfts"]],
        [list(map(float, x)) for x in doc.get("itls") or [[] for _ in range(n)]],
        rate,
        float(doc.get("burstiness") or 1.0),
        None if doc.get("duration") is None else float(doc["duration"]),
    )
