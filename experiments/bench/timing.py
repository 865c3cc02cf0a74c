"""Timing one GPU operation the way every kvlab benchmark does (METHOD: warm-up, repeats,
median; CUDA events; launch overhead hidden; cold L2)."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import torch


def time_ms(
    fn: Callable[[], object],
    device: torch.device,
    repeats: int,
    warmup: int,
    flush_bytes: int = 0,
    sleep_cycles: int = 200_000,
    cpu_clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Median milliseconds of ``fn`` over ``repeats`` calls after ``warmup`` calls.

    On CUDA each repeat is bracketed by CUDA events, after ``torch.cuda._sleep(sleep_cycles)``
    (GPU busy-wait, ~0.1 ms per 200k cycles at ~2 GHz: the host enqueues the call before the
    GPU reaches it, so host launch overhead is not timed; give more cycles for calls that
    launch many kernels) and a write of ``flush_bytes`` (larger than L2: a cold cache). On
    CPU it is ``cpu_clock`` time per call (wall clock by default; ``time.thread_time`` counts
    only the calling thread's CPU time, which other processes do not inflate), after a write
    of ``flush_bytes`` when given (larger than the last-level cache: a cold cache, untimed).
    """
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        cpu_flush = _cpu_flush_buffer(flush_bytes) if flush_bytes else None
        times = []
        for _ in range(repeats):
            if cpu_flush is not None:
                cpu_flush.fill_(1)
            start = cpu_clock()
            fn()
            times.append((cpu_clock() - start) * 1e3)
        return statistics.median(times)
    flush = torch.empty(flush_bytes, dtype=torch.uint8, device=device)
    events = []
    torch.cuda.synchronize()
    for _ in range(repeats):
        torch.cuda._sleep(sleep_cycles)
        flush.fill_(1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


@functools.cache
def _cpu_flush_buffer(num_bytes: int) -> torch.Tensor:
    """One buffer per size for every CPU timing (a profile times ~1,000 points; a fresh
    buffer each would page-fault its memory in every time)."""
    return torch.empty(num_bytes, dtype=torch.uint8)
