"""Build a workload from a plain mapping, so Hydra configs can describe any workload.

``cfg["kind"]`` picks the source; every other key is optional, and ``None`` means "use the
default" (or "not set"). Keys outside :data:`KNOWN_KEYS` raise (typos do not pass silently),
and so does a key set (not ``None``) that the kind does not use (:data:`USES`), e.g.
``duration_s`` for ``multi_turn``, which has ``num_conversations`` instead. The one
exception is ``vocab_size``, which the engine fills in from its model for every kind and
only kinds that make token ids read.

- ``synthetic``: fitted ``dataset`` lengths with an arrival process (see
  :func:`core.workload.synthetic.synthesize`).
- ``shared_prefix`` / ``multi_turn``: the Fig. 16 / Fig. 17 generators; ``multi_turn``
  is sized by ``num_conversations``, and ``num_requests`` (when set) keeps its first that
  many requests by arrival (the engine's ``serve.yaml`` sets 32 for every kind).
- ``native`` / ``azure`` / ``mooncake`` / ``vidur``: trace files with their own arrival times,
  sorted by them (``native``: ties by request id); ``start_s`` drops arrivals before it and
  moves the rest back by it (the window then starts at 0; request ids stay the file's),
  ``duration_s`` keeps arrivals before it, and ``num_requests`` the first that many, each
  in seconds of the replay (after ``time_scale``); ``apply_filter`` (vLLM's 2023 length
  filter, :mod:`core.workload.filters`) is on by default except for ``azure``, a production
  trace served row for row; ``max_total_tokens`` (``azure`` / ``mooncake`` / ``vidur``; null
  by default: no cap) drops only the rows whose prompt + output exceed it, ``auto`` meaning
  the served ``max_model_len`` (:func:`core.workload.filters.total_cap`): both act on the
  file's rows before the window is cut, and request ids count the rows they keep.
  ``mooncake`` reads each row's ``hash_ids`` (``hash_block_tokens`` prompt tokens each,
  Mooncake's 512) as prompt token ids that share exactly the blocks the trace shares
  (:func:`core.workload.trace_io.hash_block_token_ids`), made after the window is cut.
- ``vllm_log``: a real vLLM run directory (``requests.jsonl``): the recorded arrivals
  (``queued_ts − min``) and lengths, and the prompts' token ids from ``tokens_path`` (the
  workload JSONL that was sent) when given, so prefix hits replay
  (:mod:`core.workload.vllm_log`); ``vllm_bench``: a ``vllm bench serve --save-detailed``
  JSON (:mod:`core.workload.vllm_bench`): its served requests' lengths (failed rows dropped
  and counted in a warning) with its ``start_times`` minus the earliest as arrivals, or,
  when it has none or ``rate`` is set, arrivals redrawn at ``rate`` or its ``request_rate``
  and ``burstiness`` (logged); ``num_requests`` counts requests kept (a warning when the
  file holds fewer).
- ``sharegpt_json`` / ``alpaca_json``: dataset files without timestamps; requests are drawn
  (seeded, without replacement while the file lasts) and given arrivals from the arrival
  process, or all at t = 0 when ``rate`` is None.

``n`` / ``beam_width`` set the sampling of every kind except ``native``, which keeps the
sampling stored per request.

:func:`load_workload` also returns the workload's arrival window (:class:`Workload`), which a
run's ``offered_rate`` is measured over (:func:`core.metrics.summary.offered_rate`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from core.request import Request, RequestError, SamplingParams
from core.workload.arrivals import make_arrivals
from core.workload.datasets_json import read_alpaca_json, read_sharegpt_json, whitespace_tokenize
from core.workload.filters import MAX_MODEL_LEN, total_cap
from core.workload.synthetic import OPT_VOCAB_SIZE, multi_turn, shared_prefix, synthesize
from core.workload.trace_io import (
    MOONCAKE_BLOCK_TOKENS,
    read_azure_trace,
    read_mooncake_blocks,
    read_trace,
    read_vidur_trace,
    with_hash_token_ids,
)
from core.workload.vllm_bench import BenchResult, read_bench_result
from core.workload.vllm_log import (
    LoggedRequest,
    read_token_ids,
    read_vllm_log,
    requests_from_log,
)

log = logging.getLogger(__name__)
# a window past the trace's end, on a logger of its own: the rate searches (capacity) replay
# such windows at every rate and say so once in their heading (experiments.lib.batch_log)
window_log = logging.getLogger(f"{__name__}.window")

KINDS: tuple[str, ...] = (
    "synthetic",
    "native",
    "azure",
    "sharegpt_json",
    "alpaca_json",
    "mooncake",
    "vidur",
    "shared_prefix",
    "multi_turn",
    "vllm_log",
    "vllm_bench",
)
FILE_KINDS = frozenset(
    {"native", "azure", "sharegpt_json", "alpaca_json", "mooncake", "vidur", "vllm_log"}
    | {"vllm_bench"}
)
# file kinds whose arrivals come from the file (vllm_bench: its start_times, or drawn at
# its request_rate when it has none; see arrivals_note)
TIMED_KINDS = frozenset({"native", "azure", "mooncake", "vidur", "vllm_log", "vllm_bench"})
# kinds that keep every row by default: a real production trace is served as recorded, a
# row longer than max_model_len rejected by the scheduler with its reason
UNFILTERED_KINDS = frozenset({"azure"})

DEFAULTS: dict[str, Any] = {
    "dataset": "sharegpt",
    "rate": None,
    "duration_s": None,
    "start_s": None,
    "num_requests": None,
    "arrival": "poisson",
    "burstiness": 1.0,
    "n": 1,
    "beam_width": 1,
    "temperature": None,  # None: greedy for one sample, vLLM's 1.0 for n > 1 (SamplingParams)
    "path": None,
    "tokens_path": None,
    "time_scale": 1.0,
    "apply_filter": True,
    "max_total_tokens": None,  # None: no length cap; "auto": the served max_model_len
    "hash_block_tokens": MOONCAKE_BLOCK_TOKENS,  # mooncake: prompt tokens per hash_ids entry
    "with_token_ids": False,
    "vocab_size": OPT_VOCAB_SIZE,
    "prefix_len": 80,  # Fig. 16's 1-shot prefix
    "suffix_len_mean": 30.0,
    "output_len_mean": 30.0,
    "num_conversations": None,
    "rounds": 4,
    "think_time_s": 10.0,
    "max_prompt_len": 1024,  # Fig. 17: history truncated to the last 1024 tokens
    "max_output_len": 1024,  # Fig. 17: replies of at most 1024 tokens
    "sigma_input": None,  # None: the dataset's assumed spread (core.workload.lengths)
    "sigma_output": None,
}
KNOWN_KEYS = frozenset({"kind", *DEFAULTS})

_SAMPLING = frozenset({"n", "beam_width", "temperature"})
_ARRIVALS = frozenset({"rate", "arrival", "burstiness"})
_WINDOW = frozenset({"duration_s", "num_requests"})
_TIMED_FILE = _SAMPLING | _WINDOW | {
    "path", "time_scale", "apply_filter", "max_total_tokens", "start_s"
}  # fmt: skip
_DATASET_FILE = _SAMPLING | _ARRIVALS | _WINDOW | {"path", "apply_filter", "with_token_ids"}
_PREFIX = frozenset({"prefix_len", "suffix_len_mean", "output_len_mean"})
_CHAT = frozenset(
    {"num_conversations", "rounds", "think_time_s", "dataset", "with_token_ids"}
    | {"max_prompt_len", "max_output_len"}
)
USES: dict[str, frozenset[str]] = {
    "synthetic": _SAMPLING
    | _ARRIVALS
    | _WINDOW
    | {"dataset", "with_token_ids", "sigma_input", "sigma_output"},
    "shared_prefix": _SAMPLING | _ARRIVALS | _WINDOW | _PREFIX,
    "multi_turn": _SAMPLING | _ARRIVALS | _CHAT | {"num_requests"},
    "native": _WINDOW | {"path", "start_s"},
    "azure": _TIMED_FILE,
    "mooncake": _TIMED_FILE | {"hash_block_tokens"},
    "vidur": _TIMED_FILE,
    "sharegpt_json": _DATASET_FILE,
    "alpaca_json": _DATASET_FILE,
    "vllm_log": _SAMPLING | _WINDOW | {"path", "tokens_path"},
    "vllm_bench": _SAMPLING | {"path", "rate", "num_requests"},
}
"""The keys each kind reads (besides ``kind`` and ``vocab_size``)."""


def _resolve(cfg: Mapping[str, Any]) -> dict[str, Any]:
    if "kind" not in cfg or cfg["kind"] is None:
        raise RequestError(f"workload config needs a 'kind'; one of {', '.join(KINDS)}")
    if cfg["kind"] not in KINDS:
        raise RequestError(f"unknown workload kind {cfg['kind']!r}; one of {', '.join(KINDS)}")
    unknown = sorted(str(k) for k in cfg if k not in KNOWN_KEYS)
    if unknown:
        raise RequestError(f"unknown workload key(s) {', '.join(unknown)}")
    kind = cfg["kind"]
    unused = sorted(
        str(k)
        for k, v in cfg.items()
        if v is not None and k not in USES[kind] and k not in ("kind", "vocab_size")
    )
    if unused:
        hint = ""
        if "rate" in unused and "time_scale" in USES[kind]:
            hint = (
                " (a trace replays its own arrivals: time_scale sets its rate, 0.5 replaying "
                "it twice as fast)"
            )
        raise RequestError(
            f"workload key(s) {', '.join(unused)} not used by kind {kind!r}; "
            f"it reads {', '.join(sorted(USES[kind]))}{hint}"
        )
    out = dict(DEFAULTS)
    if kind in UNFILTERED_KINDS:
        out["apply_filter"] = False
    out.update({k: v for k, v in cfg.items() if v is not None})
    if out["kind"] in FILE_KINDS and out["path"] is None:
        raise RequestError(f"workload kind {out['kind']!r} needs a 'path'")
    return out


@dataclass(frozen=True)
class Workload:
    """A workload's requests (sorted by arrival) and ``window_s``, the configured window
    their arrivals fill, in seconds of the replay from its start (t = 0): ``duration_s``
    where the arrivals were drawn over it or a trace's arrivals were cut by it (an arrival
    fell at or after it, and no request count cut the window shorter); None where the
    arrivals' own span, from 0 to the last arrival, is the window."""

    requests: list[Request]
    window_s: float | None = None


def _window(requests: list[Request], c: Mapping[str, Any]) -> Workload:
    """Apply ``start_s`` (when the kind reads it), ``duration_s``, then ``num_requests`` to a
    trace sorted by arrival; the window is ``duration_s`` where it cut an arrival and the
    count cut none after it (:class:`Workload`). A ``start_s`` past the last arrival, or a
    ``duration_s`` that ends before the first, is a :class:`RequestError` naming the key."""
    start = float(c.get("start_s") or 0.0)
    if start > 0:
        kept = [replace(r, arrival_time=r.arrival_time - start)
                for r in requests if r.arrival_time >= start]  # fmt: skip
        if requests and not kept:
            raise RequestError(
                f"{start:g} s: no request arrives at or after it (the last arrives at "
                f"{requests[-1].arrival_time:.6g} s, after time_scale)",
                key="start_s",
            )
        requests = kept
    past_end, window = False, None
    if c["duration_s"] is not None:
        kept = [r for r in requests if r.arrival_time < c["duration_s"]]
        if requests and not kept:
            raise RequestError(
                f"{c['duration_s']:g} s: no request arrives in the window (the first arrives "
                f"at {requests[0].arrival_time:.6g} s from the replay's start, after start_s "
                "and time_scale)",
                key="duration_s",
            )
        past_end = bool(kept) and len(kept) == len(requests)
        window = None if len(kept) == len(requests) else float(c["duration_s"])
        requests = kept
    if c["num_requests"] is not None and len(requests) > int(c["num_requests"]):
        # said, not silent: serve.yaml's default (32) cuts a trace file of any size
        window_log.info(
            "workload.num_requests=%d keeps the first %d of the %d requests in the window "
            "(workload.num_requests=null keeps them all)",
            int(c["num_requests"]), int(c["num_requests"]), len(requests),
        )  # fmt: skip
        requests = requests[: int(c["num_requests"])]
        past_end, window = False, None
    if past_end:
        _warn_past_end(c["duration_s"], [r.arrival_time for r in requests])
    return Workload(requests, window)


TAIL_GAPS = 10  # a tail longer than this many mean gaps: the trace ended, not a slow spell


def _warn_past_end(duration_s: float, arrivals: list[float]) -> None:
    """Say that a window of ``duration_s`` cut nothing: the replay holds the trace's span
    (to its last arrival), not the window asked for. Silent when the window's empty tail is
    no longer than :data:`TAIL_GAPS` mean inter-arrival gaps, as a window that ends just
    after a trace's last arrival has (for Poisson arrivals such a tail has odds e^-10)."""
    first, last = min(arrivals), max(arrivals)
    mean_gap = (last - first) / (len(arrivals) - 1) if len(arrivals) > 1 else 0.0
    if duration_s - last <= TAIL_GAPS * mean_gap:
        return
    window_log.warning(
        "workload.duration_s=%g s runs past the trace's last arrival (%.6g s from the "
        "replay's start, after time_scale): the replay holds that span, not %g s",
        duration_s, last, duration_s,
    )  # fmt: skip


def _by_arrival(requests: list[Request]) -> list[Request]:
    """``requests`` sorted by arrival time, ties by request id (a file's rows may be in any
    order; every workload is sorted by arrival)."""
    return sorted(requests, key=lambda r: (r.arrival_time, r.request_id))


def _with_sampling(requests: list[Request], sampling: SamplingParams) -> list[Request]:
    return [replace(r, sampling=sampling) for r in requests]


def _resample_with_arrivals(
    pool: list[Request], c: Mapping[str, Any], seed: int, path: str
) -> list[Request]:
    """Draw requests from a timestamp-free dataset and give them arrival times."""
    if not pool:
        raise RequestError(f"{path}: no request passes the filter")
    if c["num_requests"] is None and c["duration_s"] is None:
        c = {**c, "num_requests": len(pool)}
    rng_arr, rng_pick = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    times = make_arrivals(
        c["arrival"], c["rate"], c["num_requests"], c["duration_s"], c["burstiness"], rng_arr
    )
    rounds = -(-len(times) // len(pool))
    picks = np.concatenate([rng_pick.permutation(len(pool)) for _ in range(rounds)])
    return [
        replace(pool[int(k)], request_id=i, arrival_time=float(t))
        for i, (t, k) in enumerate(zip(times, picks, strict=False))
    ]


def _window_log(
    logged: list[LoggedRequest], c: Mapping[str, Any]
) -> tuple[list[LoggedRequest], float | None]:
    """A vLLM log's requests in the window, and the window (:class:`Workload`'s
    ``window_s``), as :func:`_window` cuts a trace (and warns)."""
    past_end, window = False, None
    if c["duration_s"] is not None:
        kept = [r for r in logged if r.arrival < c["duration_s"]]
        past_end = bool(kept) and len(kept) == len(logged)
        window = None if len(kept) == len(logged) else float(c["duration_s"])
        logged = kept
    if c["num_requests"] is not None:
        if len(logged) > int(c["num_requests"]):
            window = None
        past_end = past_end and len(logged) <= int(c["num_requests"])
        logged = sorted(logged, key=lambda r: r.arrival)[: int(c["num_requests"])]
    if past_end:
        _warn_past_end(c["duration_s"], [r.arrival for r in logged])
    return logged, window


def _bench_drop_reason(prompt: int, output: int, success: bool) -> str | None:
    """Why a bench result row is not a request (None: it is one)."""
    if not success:
        return "successes false"
    if output < 1:
        return "output_lens 0"
    return "input_lens 0" if prompt < 1 else None


def _bench_kept_rows(bench: BenchResult, path: str) -> list[int]:
    """Rows of a bench result that were served (lengths >= 1, not marked failed); the
    dropped ones are counted, with why, in a warning."""
    n = len(bench.input_lens)
    ok = bench.successes if bench.successes is not None else [True] * n
    reasons = [
        _bench_drop_reason(bench.input_lens[r], bench.output_lens[r], ok[r]) for r in range(n)
    ]
    kept = [r for r in range(n) if reasons[r] is None]
    if len(kept) < n:
        counts = Counter(r for r in reasons if r is not None)
        detail = ", ".join(f"{k} {why}" for why, k in sorted(counts.items()))
        log.warning(
            "%s: dropped %d of %d rows, failed requests (%s)", path, n - len(kept), n, detail
        )
    return kept


def _bench_arrivals(
    bench: BenchResult, rows: list[int], c: Mapping[str, Any], seed: int, path: str
) -> list[float]:
    """Arrival of each of ``rows`` (in that order): the file's ``start_times`` minus the
    earliest (of any row) unless ``rate`` is set; else drawn (gamma at the file's
    burstiness) at ``rate`` or the file's ``request_rate``, all at t = 0 when that is inf.
    Neither ``rate`` nor the file's ``start_times`` and ``request_rate`` (absent, not inf)
    is a :class:`RequestError` naming the file and key."""
    if bench.start_times is not None and c["rate"] is None:
        t0 = min(bench.start_times)
        log.info("%s: arrivals from the file's start_times", path)
        return [bench.start_times[r] - t0 for r in rows]
    if c["rate"] is None and not bench.rate_saved:
        raise RequestError(
            f"{path}, key 'request_rate': absent, and the file has no start_times: the "
            "arrivals are unknown (set workload.rate to draw them)"
        )
    rate = c["rate"] if c["rate"] is not None else bench.request_rate
    kind = "gamma" if rate is not None else "all_at_once"
    how = f"gamma at {rate} req/s, burstiness {bench.burstiness}" if rate else "all at t=0"
    why = "rate is set" if c["rate"] is not None else "the file has no start_times"
    log.info("%s: arrivals redrawn (%s; %s)", path, how, why)
    rng = np.random.default_rng(seed)
    return [float(t) for t in make_arrivals(kind, rate, len(rows), None, bench.burstiness, rng)]


def _from_bench(
    bench: BenchResult, c: Mapping[str, Any], seed: int, sampling: SamplingParams, path: str
) -> list[Request]:
    """A bench result's served requests, sorted by arrival (ties: file order), ids 0, 1, ...
    in that order; ``num_requests`` keeps the first that many (the earliest when arrivals
    are the file's; a warning when it holds fewer). Arrivals: :func:`_bench_arrivals`."""
    rows = _bench_kept_rows(bench, path)
    want = None if c["num_requests"] is None else int(c["num_requests"])
    if want is not None and want > len(rows):
        log.warning(
            "%s: num_requests=%d but the file holds %d usable requests; using %d",
            path, want, len(rows), len(rows),
        )  # fmt: skip
    if bench.start_times is None or c["rate"] is not None:
        rows = rows[:want]  # drawn arrivals go to the file's first rows
    times = _bench_arrivals(bench, rows, c, seed, path)
    order = sorted(range(len(rows)), key=lambda k: (times[k], k))[:want]
    return [
        Request(i, times[k], bench.input_lens[rows[k]], bench.output_lens[rows[k]], sampling)
        for i, k in enumerate(order)
    ]


def arrivals_note(cfg: Mapping[str, Any]) -> str:
    """Where a run's arrivals come from, for its summary line: ``rate=<rate>``, "all
    arrivals at t=0" (``arrival=all_at_once``, which draws no rate), "arrivals from the
    workload file", or, for a ``vllm_bench`` file without ``start_times``, "arrivals
    redrawn at the file's request_rate"."""
    rate, kind = cfg.get("rate"), cfg.get("kind")
    if kind not in TIMED_KINDS and cfg.get("arrival") == "all_at_once":
        return "conversations all start at t=0" if kind == "multi_turn" else "all arrivals at t=0"
    if rate is not None or kind not in TIMED_KINDS:
        return f"rate={rate}"
    if kind == "vllm_bench":
        bench = read_bench_result(str(cfg.get("path")))
        if bench.start_times is None and bench.request_rate is None:
            return "arrivals all at t=0 (the file's request_rate is inf, no start_times)"
        if bench.start_times is None:
            return f"arrivals redrawn at the file's request_rate={bench.request_rate}"
    return "arrivals from the workload file"


def build_workload(
    cfg: Mapping[str, Any], max_model_len: int = MAX_MODEL_LEN, seed: int = 0
) -> list[Request]:
    """Requests described by ``cfg`` (see the module docstring for keys and kinds)."""
    return load_workload(cfg, max_model_len, seed).requests


def load_workload(
    cfg: Mapping[str, Any], max_model_len: int = MAX_MODEL_LEN, seed: int = 0
) -> Workload:
    """:func:`build_workload`'s requests with their arrival window (:class:`Workload`): a
    drawn workload's ``duration_s`` (``synthetic``, ``shared_prefix``, and the JSON
    datasets without a request count), a trace's ``duration_s`` where it cut the trace
    (:func:`_window`), else None."""
    c = _resolve(cfg)
    kind = c["kind"]
    sampling = SamplingParams(
        n=int(c["n"]),
        beam_width=int(c["beam_width"]),
        temperature=None if c["temperature"] is None else float(c["temperature"]),
    )
    count = None if c["num_requests"] is None else int(c["num_requests"])
    drawn_window = None if c["duration_s"] is None else float(c["duration_s"])
    if kind == "synthetic":
        return Workload(synthesize(
            c["dataset"], c["rate"], count, c["duration_s"], c["arrival"], c["burstiness"],
            max_model_len, seed, sampling, bool(c["with_token_ids"]), int(c["vocab_size"]),
            (c["sigma_input"], c["sigma_output"]),
        ), drawn_window)  # fmt: skip
    if kind == "shared_prefix":
        return Workload(shared_prefix(
            int(c["prefix_len"]), c["rate"], count, c["duration_s"], c["arrival"],
            c["burstiness"], float(c["suffix_len_mean"]), float(c["output_len_mean"]),
            max_model_len=max_model_len, seed=seed, sampling=sampling,
            vocab_size=int(c["vocab_size"]),
        ), drawn_window)  # fmt: skip
    if kind == "multi_turn":
        if c["num_conversations"] is None:
            raise RequestError("workload kind 'multi_turn' needs 'num_conversations'")
        chats = multi_turn(
            int(c["num_conversations"]), int(c["rounds"]), c["rate"], c["arrival"],
            c["burstiness"], float(c["think_time_s"]), c["dataset"],
            max_prompt_len=int(c["max_prompt_len"]), max_output_len=int(c["max_output_len"]),
            max_model_len=max_model_len, seed=seed, sampling=sampling,
            with_token_ids=bool(c["with_token_ids"]), vocab_size=int(c["vocab_size"]),
        )  # fmt: skip
        return _window(_by_arrival(chats), c)
    path = str(c["path"])
    if kind == "vllm_log":
        logged, window = _window_log(read_vllm_log(path), c)
        ids = None
        if c["tokens_path"] is not None:
            ids = read_token_ids(c["tokens_path"], logged)
        return Workload(requests_from_log(logged, ids, sampling), window)
    if kind == "vllm_bench":
        return Workload(_from_bench(read_bench_result(path), c, seed, sampling, path))
    if kind == "native":
        return _window(_by_arrival(read_trace(path)), c)
    if kind == "mooncake":
        block = int(c["hash_block_tokens"])
        requests, hashes = read_mooncake_blocks(
            path, max_model_len, None, float(c["time_scale"]), bool(c["apply_filter"]),
            max_total_tokens=total_cap(c["max_total_tokens"], max_model_len),
            hash_block_tokens=block,
        )  # fmt: skip
        cut = _window(requests, c)  # the window first: ids only for the requests it keeps
        kept = with_hash_token_ids(cut.requests, hashes, block, int(c["vocab_size"]))
        return Workload(_with_sampling(kept, sampling), cut.window_s)
    timed: dict[str, Callable[..., list[Request]]] = {
        "azure": read_azure_trace,
        "vidur": read_vidur_trace,
    }
    if kind in timed:
        requests = timed[kind](
            path, max_model_len, None, float(c["time_scale"]), bool(c["apply_filter"]),
            max_total_tokens=total_cap(c["max_total_tokens"], max_model_len),
        )  # fmt: skip
        cut = _window(requests, c)
        return Workload(_with_sampling(cut.requests, sampling), cut.window_s)
    reader = read_sharegpt_json if kind == "sharegpt_json" else read_alpaca_json
    pool = reader(
        path,
        tokenize=partial(whitespace_tokenize, vocab_size=int(c["vocab_size"])),
        max_model_len=max_model_len,
        apply_filter=bool(c["apply_filter"]),
        with_token_ids=bool(c["with_token_ids"]),
        sampling=sampling,
    )
    window = drawn_window if c["num_requests"] is None else None
    return Workload(_resample_with_arrivals(pool, c, seed, path), window)
