"""The fixed part of a decoder layer's matmul time, fitted across shard sizes.

At a few tokens a layer's matmuls stream their weights: time ≈ ``fixed + weights × bytes /
bandwidth``. The fixed part (kernel launches, each kernel's ramp and tail) does not shrink
with the shard, so a matmul far smaller than a profiled one keeps less of the profile's
speed than the roofline ratio says. On Vidur's A100 tables the fixed part is about 22 µs
a layer (CodeLlama-34B at tp 1-8: 21.9 µs; Llama-2-7B at tp 1-8: 21.6 µs), ~8% of the
profiled Llama-2-7B layer's matmul time at one token and ~40% of its tp-8 shard's
(``docs/validation/profile-transfer.md``).

:func:`fit_fixed_latency` fits it from profiles of one GPU at two or more shard sizes: a
least-squares line of the mean matmul time at up to :data:`FIT_TOKENS` tokens against the
matmul weights per GPU; its intercept, bounded to ``[0, smallest time)``, is the fixed part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FIT_TOKENS = 16  # weight-stream-bound on every GPU in the catalog (roofline knee > 100 tokens)


@dataclass(frozen=True)
class FixedLatencyFit:
    """``seconds``: the fixed part of a layer's matmul time; ``seconds_per_weight``: the
    slope (weight bytes over the achieved bandwidth); ``points``: ``(weights per GPU,
    measured s, fitted s)`` per profile; ``note``: how it was fitted, for a source text."""

    seconds: float
    seconds_per_weight: float
    points: tuple[tuple[float, float, float], ...]
    note: str


def mean_small_batch_time(tokens: np.ndarray, times: np.ndarray) -> float:
    """The mean of ``times`` at up to :data:`FIT_TOKENS` tokens (at the smallest count when
    none is that small)."""
    small = tokens <= FIT_TOKENS
    return float(times[small].mean() if small.any() else times[np.argmin(tokens)])


def fit_fixed_latency(shards: list[tuple[float, float]]) -> FixedLatencyFit:
    """Fit ``time = fixed + slope × weights`` to ``shards``: ``(matmul weights per GPU, mean
    small-batch matmul time in s)``, one per profile of one GPU. ``fixed`` is 0 with fewer
    than two distinct sizes, and is clipped to ``[0, smallest time × 0.9]`` (a negative
    intercept is noise; a fixed part as large as a measured time would leave nothing to
    transfer)."""
    if any(not (w > 0 and t > 0 and np.isfinite(w) and np.isfinite(t)) for w, t in shards):
        raise ValueError(f"fixed latency: weights and times must be finite and > 0: {shards}")
    w = np.array([s[0] for s in shards], dtype=float)
    t = np.array([s[1] for s in shards], dtype=float)
    if len(np.unique(w)) < 2:
        pts = tuple((float(a), float(b), float(b)) for a, b in zip(w, t, strict=True))
        return FixedLatencyFit(0.0, float(t[0] / w[0]) if len(w) else 0.0, pts,
                               "one shard size: no fixed part")  # fmt: skip
    slope, intercept = np.polyfit(w, t, 1)
    fixed = float(np.clip(intercept, 0.0, 0.9 * t.min()))
    if fixed != intercept:
        slope = float(np.sum((t - fixed) * w) / np.sum(w * w))  # refit the slope alone
    fitted = fixed + slope * w
    pts = tuple((float(a), float(b), float(c)) for a, b, c in zip(w, t, fitted, strict=True))
    sizes = ", ".join(f"{a / 1e6:.0f}M" for a in sorted(w))
    note = (
        f"intercept of the mean matmul time at 1-{FIT_TOKENS} tokens against matmul weights "
        f"per GPU, least squares over {len(w)} shards ({sizes})"
    )
    return FixedLatencyFit(fixed, float(slope), pts, note)
