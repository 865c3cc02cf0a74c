"""Summary metrics from the recorder's tables.

Key names follow ``vllm bench serve``: ``request_throughput`` (req/s),
``output_throughput`` (tok/s; the output tokens count every sample and beam of a request,
``output_len * num_seqs``), ``mean_/median_/p99_{ttft,tpot,itl,e2el}_ms``, plus
``goodput`` (req/s meeting every given SLO; a request with one output token has no TPOT to
miss). kvlab adds:

- ``slo_attainment``: the fraction of all requests meeting every given SLO (a rejected
  request misses them);

- ``normalized_latency``: the vLLM paper's metric (§6.1), mean over finished requests of
  end-to-end latency / output length, in s/token;
- two batch metrics that must not be mixed up (for vLLM's 2023 scheduler they part as
  prompts arrive more often: 1.10x at ShareGPT 2 req/s, 2.4x at Alpaca 30 req/s in the
  10-minute reproduction):

  - ``mean_batch_size``: requests *holding KV* in the running batch, time-weighted mean
    over busy steps (by step duration). This is the paper's Fig. 13 "batched requests".
    With several replicas it is a replica's batch, and ``busy_time_s`` sums the
    replicas' busy time.
  - ``mean_step_batch``: requests *computed in a step*, plain mean over steps. A
    prompt-only step of vLLM's 2023 scheduler computes only the prompts it admits while
    the running requests wait, so this is smaller than ``mean_batch_size``.

- ``kv_*_pct``: the time-weighted (by step duration) KV memory breakdown, in percent of
  device KV slots. ``kv_external_frag_pct`` is "external fragmentation & other": slots the
  allocator's size classes waste plus free slots *while requests wait on memory* for
  admission or for swap-in (memory that exists but cannot serve them);
  ``kv_free_at_limit_pct``: free slots while they wait on a scheduler limit instead
  (``max_num_seqs``, the token budget, a request-level batch in flight: steps.csv's
  ``queue_held_by``, ``core.plan.HELD_BY_*``, limits first), memory the policy's limits
  leave idle rather than memory the allocator cannot use; free slots with nobody waiting
  are ``kv_free_pct``. The six parts sum to 100;
- ``kv_free_at_<limit>_pct`` (``max_num_seqs``, ``token_budget``, ``batch_in_flight``,
  ``policy_limit``; ``core.plan.HELD_BY_KEY``): ``kv_free_at_limit_pct`` split by the
  limit that held the queue's head, so they sum to it;
- ``kv_sharing_saving_pct``: memory saved by block sharing (Kwon et al., Fig. 15: blocks
  saved by sharing / blocks needed without sharing), time-weighted as a ratio of
  duration-weighted sums, 100 * sum(w * (logical - physical)) / sum(w * logical), so a step
  counts by how long it lasted and how many blocks it held. 0 without sharing (contiguous
  managers, single-sequence requests without prefix caching).
- ``prefix_cache_hit_tokens`` / ``prefix_cache_hit_pct``: the finished requests' prompt
  tokens the prefix cache held when each was first admitted (``requests.csv``'s
  ``cached_prompt_tokens``), and their share of those requests' prompt tokens; 0 with
  prefix caching off. A re-admission after a recompute preemption, which finds the request's
  own blocks again, does not count: ``prefix_cache_readmit_tokens`` counts those, the
  finished requests' tokens (prompt and generated) the prefix cache held at their
  re-admissions after recompute preemptions (``requests.csv``'s ``readmit_cached_tokens``),
  the recompute that prefix caching spared them. Memory saved (``kv_sharing_saving_pct``)
  is another thing: requests that never overlap in time can hit the cache and share nothing.

- ``total_copy_blocks``, ``total_swap_out_blocks``, ``total_swap_in_blocks``: the device
  block copies (paged: copy-on-write, a sample or beam writing into a block it shares;
  contiguous: a fork's copy of its parent's blocks) and the blocks swapped out to and in
  from the CPU pool over the run: ``steps.csv``'s ``copy_blocks``, ``swap_out_blocks`` and
  ``swap_in_blocks`` summed (:func:`block_moves`).

- ``offered_rate``: the arrival rate the run was offered, in req/s: every request of the
  run (rejected ones included) over its arrival window, the configured window where the
  workload has one (``duration_s`` of a drawn workload, or of a trace that it cut), else
  the span from the replay's start (t = 0: a trace's first row, a native trace's 0 s, or
  its ``start_s``) to the last arrival (:func:`offered_rate`); NaN (``null`` in
  ``metrics.json``) where that window is 0 s (every arrival at t = 0:
  ``arrival=all_at_once``, or a trace of one request at its start). Unlike
  ``request_throughput`` it does not count the drain after the last arrival, nor depend on
  how many requests completed.

Throughput duration is from the first arrival to the last finish.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from core.plan import HELD_BY_KEY, HELD_BY_MEMORY

if TYPE_CHECKING:  # a recorder's steps, read as a frame's columns (summarize_recorder)
    from core.metrics.recorder import StepsView

# the metrics splitting ``kv_free_at_limit_pct``, in ``HELD_BY_KEY``'s order
FREE_AT_LIMIT_KEYS = tuple(f"kv_free_at_{name}_pct" for name in HELD_BY_KEY.values())


def _stats(prefix: str, values_s: np.ndarray) -> dict[str, float]:
    if values_s.size == 0:
        nan = math.nan
        return {f"mean_{prefix}_ms": nan, f"median_{prefix}_ms": nan, f"p99_{prefix}_ms": nan}
    ms = values_s * 1000.0  # a new array: the median and percentile reorder it in place,
    mean = float(np.mean(ms))  # after the mean, whose sum goes in its order
    return {
        f"mean_{prefix}_ms": mean,
        f"median_{prefix}_ms": float(np.median(ms, overwrite_input=True)),
        f"p99_{prefix}_ms": float(np.percentile(ms, 99, overwrite_input=True)),
    }


# the six parts of the breakdown, which sum to the KV slots (memory_shares), in that order
_SIX = ("token_states", "reserved", "internal_frag", "external_frag", "free_at_limit", "free")


def _parts(
    steps: pd.DataFrame | StepsView,
) -> tuple[Callable[[str], np.ndarray], np.ndarray]:
    """A function giving each part of the KV breakdown per step in slots (the six of
    :func:`memory_shares`, then ``free_at_<name>`` for each limit of ``HELD_BY_KEY``), made
    anew on each call (a long run's parts are not all held at once), and the slots of the
    six."""
    # a request swapped out waits as much as one waiting for admission
    waiting = (steps["num_waiting"].to_numpy() > 0) | (steps["num_swapped"].to_numpy() > 0)
    # tables written before the column: every wait counted as one on memory
    held = steps["queue_held_by"].to_numpy() if "queue_held_by" in steps else 0
    at_limit = waiting & (held != HELD_BY_MEMORY)
    free = steps["kv_free"].to_numpy(dtype=float)
    limits = {f"free_at_{name}": code for code, name in HELD_BY_KEY.items()}

    def part(name: str) -> np.ndarray:
        if name in ("token_states", "reserved", "internal_frag"):
            return steps[f"kv_{name}"].to_numpy(dtype=float)
        if name == "external_frag":
            padding = steps["kv_allocator_padding"].to_numpy(dtype=float)
            return padding + np.where(waiting & ~at_limit, free, 0.0)
        if name == "free_at_limit":
            return np.where(at_limit, free, 0.0)
        if name == "free":
            return np.where(waiting, 0.0, free)
        return np.where(waiting & (held == limits[name]), free, 0.0)

    return part, sum(map(part, _SIX))  # 0 + the first + the second ..., one part at a time


def _weighted_pct(steps: pd.DataFrame | StepsView, names: list[str]) -> dict[str, float]:
    if steps.empty or steps["duration_s"].sum() <= 0:
        return {f"kv_{k}_pct": math.nan for k in names}
    w = steps["duration_s"].to_numpy()
    part, total = _parts(steps)
    return {f"kv_{k}_pct": float(100.0 * np.sum(w * part(k) / total) / np.sum(w)) for k in names}


def memory_shares(steps: pd.DataFrame | StepsView) -> dict[str, float]:
    """Time-weighted KV breakdown in percent (see module doc)."""
    return _weighted_pct(steps, list(_SIX))


def free_at_limit_shares(steps: pd.DataFrame | StepsView) -> dict[str, float]:
    """``kv_free_at_limit_pct`` split by the limit holding the queue's head
    (``kv_free_at_<name>_pct`` for each name of ``core.plan.HELD_BY_KEY``), weighted as
    :func:`memory_shares` weighs, so they sum to it; NaN where it is NaN."""
    return _weighted_pct(steps, [f"free_at_{name}" for name in HELD_BY_KEY.values()])


def sharing_saving_pct(steps: pd.DataFrame | StepsView) -> float:
    """Time-weighted memory saving from block sharing in percent (see module doc); NaN when
    no step held a block."""
    if steps.empty:
        return math.nan
    w = steps["duration_s"].to_numpy()
    logical = np.dot(w, steps["kv_logical_blocks"].to_numpy(dtype=float))
    if logical <= 0:
        return math.nan
    physical = np.dot(w, steps["kv_physical_blocks"].to_numpy(dtype=float))
    return float(100.0 * (logical - physical) / logical)


def offered_rate(arrivals_s: np.ndarray, window_s: float | None = None) -> float:
    """The offered arrival rate (req/s, see the module doc): ``len(arrivals_s)`` over
    ``window_s``, or, where that is None, over the span from t = 0 to the last arrival; NaN
    without requests or where the window is not > 0 (every arrival at t = 0)."""
    times = np.asarray(arrivals_s, dtype=float)
    if times.size == 0:
        return math.nan
    window = float(window_s) if window_s is not None else float(times.max())
    return float(times.size / window) if window > 0 else math.nan


def summarize(
    requests: pd.DataFrame,
    steps: pd.DataFrame | StepsView,
    itl_s: np.ndarray | None = None,
    slo_ms: Mapping[str, float] | None = None,
    max_itl_s: Mapping[int, float] | None = None,
    arrival_window_s: float | None = None,
) -> dict[str, float]:
    """Compute the summary dict. ``slo_ms`` maps ``ttft``/``tpot``/``itl``/``e2el`` to
    limits in ms for goodput (requests meeting all of them, per second) and
    ``slo_attainment`` (their share of all requests). An ``itl`` limit holds a
    request's longest inter-token gap, from ``max_itl_s`` (request id -> seconds; a
    request with one output token has no gap and meets it). ``arrival_window_s``: the
    workload's configured arrival window (:class:`core.workload.spec.Workload`), which
    ``offered_rate`` is over; None: the span to the last arrival. ``steps``: the steps
    table, a frame or a recorder's :class:`~core.metrics.recorder.StepsView`."""
    done = requests[requests["status"] == "finished"]
    out: dict[str, float] = {
        "num_requests": len(requests),
        "completed": len(done),
        "rejected": int((requests["status"] == "rejected").sum()),
    }
    if len(done):
        start = float(requests["arrival_s"].min())
        duration = float(done["finish_s"].max()) - start
    else:
        duration = 0.0
    out["duration_s"] = duration
    total_out = float((done["output_len"] * done["num_seqs"]).sum())
    out["total_input_tokens"] = int(done["prompt_len"].sum())
    out["total_output_tokens"] = int(total_out)
    out["offered_rate"] = offered_rate(requests["arrival_s"].to_numpy(), arrival_window_s)
    out["request_throughput"] = len(done) / duration if duration > 0 else math.nan
    out["output_throughput"] = total_out / duration if duration > 0 else math.nan
    out.update(_stats("ttft", done["ttft_s"].to_numpy(dtype=float)))
    out.update(_stats("tpot", done["tpot_s"].dropna().to_numpy(dtype=float)))
    out.update(_stats("itl", np.asarray(itl_s if itl_s is not None else [], dtype=float)))
    out.update(_stats("e2el", done["e2el_s"].to_numpy(dtype=float)))
    norm = done["e2el_s"] / done["output_len"]
    out["normalized_latency"] = float(norm.mean()) if len(done) else math.nan
    out["num_preemptions"] = int(requests["num_preemptions"].sum())
    out.update(block_moves(steps))
    if slo_ms:
        ok = np.ones(len(done), dtype=bool)
        for key, limit in slo_ms.items():
            if key == "itl":
                gaps = done["request_id"].map(dict(max_itl_s or {})).fillna(0.0)
                ok &= gaps.to_numpy(dtype=float) * 1000.0 <= limit
                continue
            col = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2el_s"}.get(key)
            if col is None:
                raise ValueError(f"unknown SLO {key!r}; use ttft, tpot, itl or e2el")
            ok &= (done[col].fillna(0.0).to_numpy() * 1000.0) <= limit
        out["goodput"] = float(ok.sum() / duration) if duration > 0 else math.nan
        # A rejected request missed its SLOs: attainment is over every request.
        out["slo_attainment"] = float(ok.sum() / len(requests)) if len(requests) else math.nan
    out.update(_batch_stats(steps))
    out.update(memory_shares(steps))
    out.update(free_at_limit_shares(steps))
    out["kv_sharing_saving_pct"] = sharing_saving_pct(steps)
    out.update(prefix_cache_hits(done))
    return out


def prefix_cache_hits(done: pd.DataFrame) -> dict[str, float]:
    """``prefix_cache_hit_tokens``, ``prefix_cache_hit_pct`` and
    ``prefix_cache_readmit_tokens`` of the finished requests ``done`` (see the module doc);
    NaN where their table lacks the column each is summed from (one recorded before it
    existed), the first two also where it holds no prompt token."""
    prompt = float(done["prompt_len"].sum())
    out: dict[str, float] = {"prefix_cache_hit_tokens": math.nan, "prefix_cache_hit_pct": math.nan}
    if "cached_prompt_tokens" in done and prompt > 0:
        hits = float(done["cached_prompt_tokens"].fillna(0).sum())
        out = {"prefix_cache_hit_tokens": int(hits), "prefix_cache_hit_pct": 100.0 * hits / prompt}
    readmit = done.get("readmit_cached_tokens")
    out["prefix_cache_readmit_tokens"] = (
        math.nan if readmit is None else int(readmit.fillna(0).sum())
    )
    return out


def block_moves(steps: pd.DataFrame | StepsView) -> dict[str, float]:
    """``total_copy_blocks``, ``total_swap_out_blocks`` and ``total_swap_in_blocks``: the
    steps' ``copy_blocks`` (device block copies: copy-on-write, or a contiguous fork's),
    ``swap_out_blocks`` and ``swap_in_blocks`` (to and from the CPU pool), summed; NaN
    where ``steps`` lacks the column (a table of one's own without it)."""
    return {
        f"total_{col}": int(steps[col].sum()) if col in steps else math.nan
        for col in ("copy_blocks", "swap_out_blocks", "swap_in_blocks")
    }


def _batch_stats(steps: pd.DataFrame | StepsView) -> dict[str, float]:
    if steps.empty:
        return {"num_steps": 0, "mean_batch_size": math.nan, "mean_step_batch": math.nan,
                "busy_time_s": 0.0}  # fmt: skip
    w = steps["duration_s"].to_numpy()
    wsum = w.sum()
    running = steps["running_requests"].to_numpy(dtype=float)
    return {
        "num_steps": len(steps),
        "mean_batch_size": float(np.sum(w * running) / wsum) if wsum > 0 else math.nan,
        "mean_step_batch": float(steps["batch_requests"].mean()),
        "busy_time_s": float(wsum),
    }


# Why a request was rejected, by a phrase of the scheduler's reason (core.sched).
_REJECT_KINDS = (
    ("max_model_len", "max_model_len"),
    ("max_num_seqs", "max_num_seqs"),
    ("kv_cache", "KV cache"),
    ("kv_cache", "KV-cache"),
)
REJECT_KINDS = ("max_model_len", "max_num_seqs", "kv_cache", "other")


def rejection_counts(requests: pd.DataFrame) -> dict[str, int]:
    """``rejected_<kind>`` for each kind in :data:`REJECT_KINDS`: how many requests were
    rejected because they exceed ``max_model_len``, need more sequences than
    ``max_num_seqs``, can never fit the KV cache, or for another reason."""
    counts = dict.fromkeys(REJECT_KINDS, 0)
    rejected = requests.loc[requests["status"] == "rejected", "reject_reason"]
    for reason in rejected.fillna("").astype(str):
        kind = next((k for k, phrase in _REJECT_KINDS if phrase in reason), "other")
        counts[kind] += 1
    return {f"rejected_{k}": n for k, n in counts.items()}


def summarize_recorder(
    recorder: Any,
    slo_ms: Mapping[str, float] | None = None,
    arrival_window_s: float | None = None,
) -> dict[str, Any]:
    """:func:`summarize` of a :class:`core.metrics.recorder.Recorder`'s tables plus
    :func:`rejection_counts`: what both bodies' apps report. An ``itl`` SLO needs the
    recorder's token times (a ValueError without them: every request would meet it);
    ``arrival_window_s``: :func:`summarize`'s. The steps are read a column at a time
    (``Recorder.steps_view``), never as one frame of them all."""
    if slo_ms and "itl" in slo_ms and not getattr(recorder, "keep_token_times", True):
        raise ValueError("an itl SLO needs token times: record with keep_token_times=True")
    requests = recorder.requests_frame()
    out: dict[str, Any] = summarize(
        requests,
        recorder.steps_view(),
        recorder.inter_token_latencies(copy=False),
        slo_ms,
        recorder.max_itl_by_request(),
        arrival_window_s,
    )
    out.update(rejection_counts(requests))
    return out
