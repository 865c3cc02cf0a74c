"""How fast this CPU core runs right now: a fixed workload timed between engine steps.

A shared VM's speed drifts: on the project's 2-core VM, the same engine run served twice
minutes apart took 15% and then 33% longer per step than its operator profile
(``docs/validation/cpu-engine.md``), and thread CPU time does not hide it (the neighbours
take memory bandwidth and cache, not the core). :class:`SpeedProbe` times
:data:`PROBE_PRODUCTS` products of a seeded 768 × 3072 fp32 matrix with one vector on the
calling thread (about 1 ms here; a weight stream, like the engine's small-batch steps).
:meth:`SpeedProbe.scale` samples it every ``every`` calls and returns
``NOMINAL_S / median(last window samples)``: multiplied into a thread-CPU step time, it gives
the time on a core where the probe takes :data:`NOMINAL_S`, the same for every run and
profile timed this way.

Why that is sound here: over a 150 s test on this VM, 20 windows' median probe and median
12-layer one-token forward moved together (correlation 0.90 for one row, 0.95 for four)
while both varied by 10–20%.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

import torch

NOMINAL_S = 1e-3  # the probe's time on the reference core the scaled times describe
PROBE_PRODUCTS = 4
PROBE_SHAPE = (768, 3072)  # OPT-125M's MLP up-projection: 9.4 MB of fp32, past L2


class SpeedProbe:
    """Times the probe on the calling thread's CPU clock; see the module doc."""

    def __init__(self, every: int = 4, window: int = 9) -> None:
        if every < 1 or window < 1:
            raise ValueError(f"every and window must be >= 1, got {every} and {window}")
        gen = torch.Generator().manual_seed(0)
        self.weight = torch.randn(*PROBE_SHAPE, generator=gen)
        self.vector = torch.randn(1, PROBE_SHAPE[0], generator=gen)
        self.every = every
        self.recent: deque[float] = deque(maxlen=window)
        self.samples: list[float] = []
        self._calls = 0

    def sample(self) -> float:
        """One timing of the probe, in thread CPU seconds (kept in ``samples``)."""
        with torch.inference_mode():
            t0 = time.thread_time()
            for _ in range(PROBE_PRODUCTS):
                self.vector @ self.weight
            seconds = time.thread_time() - t0
        self.recent.append(seconds)
        self.samples.append(seconds)
        return seconds

    def scale(self) -> float:
        """``NOMINAL_S`` over the median of the recent samples, sampling first on every
        ``every``-th call (the first call always samples)."""
        if self._calls % self.every == 0:
            self.sample()
        self._calls += 1
        return NOMINAL_S / max(statistics.median(self.recent), 1e-9)

    def summary(self) -> dict[str, float | int]:
        """What a run records of its probes: their count, median, min and max seconds."""
        s = self.samples
        if not s:
            return {"nominal_s": NOMINAL_S, "samples": 0}
        return {
            "nominal_s": NOMINAL_S,
            "samples": len(s),
            "median_s": statistics.median(s),
            "min_s": min(s),
            "max_s": max(s),
        }
