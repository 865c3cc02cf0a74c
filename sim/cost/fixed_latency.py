"""The fixed part of a decoder layer's operator time, fitted across shard sizes.

At a few tokens an operator group's time is a fixed part plus a part in proportion to the
layer's size on one GPU:

- ``linear`` (the matmuls) streams its weights: ``fixed + weights × bytes / bandwidth``;
  the fixed part is kernel launches and each kernel's ramp and tail. On Vidur's A100
  tables it is about 22 µs a layer (CodeLlama-34B at tp 1-8: 21.9 µs; Llama-2-7B: 21.6
  µs), ~8% of the profiled Llama-2-7B layer's matmul time at one token and ~40% of its
  tp-8 shard's;
- ``other`` (norms, rotary, activation, residual add) is launch-bound: ``fixed + elements
  per token × a per-element time`` (the tables show the growth with the elements; they do
  not show why). On the same tables about 6-9 µs (CodeLlama-34B: 5.5 µs; Llama-2-7B: 8.7
  µs).

Neither fixed part shrinks with the shard, so a profile transferred to a far smaller shard
by the size ratio alone comes out low (matmuls) and, scaled along the token axis, high
(elementwise): ``docs/validation/profile-transfer.md``.

:func:`fit_fixed_latency` fits one from profiles of one GPU at two or more shard sizes: a
least-squares line of the mean time at up to :data:`FIT_TOKENS` tokens against the size;
its intercept, bounded to ``[0, 0.9 × the smallest time]``, is the fixed part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FIT_TOKENS = 16  # weight-stream-bound on every GPU in the catalog (roofline knee > 100 tokens)


@dataclass(frozen=True)
class FixedLatencyFit:
    """``seconds``: the fixed part; ``seconds_per_unit``: the slope per unit of size;
    ``points``: ``(size, measured s, fitted s)`` per profile; ``note``: how it was fitted,
    for a source text."""

    seconds: float
    seconds_per_unit: float
    points: tuple[tuple[float, float, float], ...]
    note: str


def mean_small_batch_time(tokens: np.ndarray, times: np.ndarray) -> float:
    """The mean of ``times`` at up to :data:`FIT_TOKENS` tokens (at the smallest count when
    none is that small)."""
    small = tokens <= FIT_TOKENS
    return float(times[small].mean() if small.any() else times[np.argmin(tokens)])


def fit_fixed_latency(
    shards: list[tuple[float, float]], size: str = "matmul weights per GPU", unit: float = 1e6
) -> FixedLatencyFit:
    """Fit ``time = fixed + slope × size`` to ``shards``: ``(size, mean small-batch time in
    s)``, one per profile of one GPU (``size`` names the size in the note, which shows each
    in multiples of ``unit``). ``fixed`` is 0 with fewer than two distinct sizes, and is
    clipped to ``[0, smallest time × 0.9]`` (a negative intercept is noise; a fixed part as
    large as a measured time would leave nothing to transfer)."""
    if any(not (w > 0 and t > 0 and np.isfinite(w) and np.isfinite(t)) for w, t in shards):
        raise ValueError(f"fixed latency: sizes and times must be finite and > 0: {shards}")
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
    suffix = {1e6: "M", 1e3: "k"}.get(unit, f"x{unit:g}")
    sizes = ", ".join(f"{a / unit:.0f}{suffix}" for a in sorted(w))
    note = (
        f"intercept of the mean time at 1-{FIT_TOKENS} tokens against {size}, least squares "
        f"over {len(w)} shards ({sizes})"
    )
    return FixedLatencyFit(fixed, float(slope), pts, note)
