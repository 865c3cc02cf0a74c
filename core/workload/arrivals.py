"""Arrival-time processes, in seconds from t = 0, sorted ascending.

Convention (a choice): arrivals are a renewal process started at t = 0, so the first
arrival comes one inter-arrival time after 0 and ``arrivals[i] = x_0 + ... + x_i``. With a
``duration`` the process yields every arrival strictly before it (possibly none).

Burstiness follows vLLM's benchmark ``--burstiness`` convention: inter-arrival times are
Gamma-distributed with shape ``burstiness`` and scale ``1 / (rate * burstiness)``, so the mean
stays ``1 / rate`` and the coefficient of variation is ``1 / sqrt(burstiness)``. Burstiness 1
is a Poisson process; below 1 is burstier, above 1 more regular.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from core.request import RequestError

ARRIVAL_KINDS = ("poisson", "gamma", "all_at_once")


def _check_positive(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise RequestError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise RequestError(f"{name} must be finite and > 0, got {value!r}")
    return v


def _check_count(n: int | None, duration: float | None) -> None:
    if (n is None) == (duration is None):
        raise RequestError("give exactly one of n (number of arrivals) or duration (seconds)")
    if n is not None and (isinstance(n, bool) or int(n) != n or n < 0):
        raise RequestError(f"n must be an integer >= 0, got {n!r}")
    if duration is not None:
        _check_positive("duration", duration)


def _renewal(
    draw: Callable[[int], np.ndarray],
    mean_gap: float,
    n: int | None,
    duration: float | None,
) -> np.ndarray:
    """Cumulative sums of gaps from ``draw(size)`` for n arrivals or until ``duration``.

    Gaps are drawn in chunks but summed once, so the arrivals before a duration are exactly
    the first arrivals of the counted process with the same generator state.
    """
    if n is not None:
        return np.cumsum(draw(int(n)))
    assert duration is not None
    gaps: list[np.ndarray] = []
    t = 0.0
    while t < duration:
        expected = (duration - t) / mean_gap
        size = int(min(max(64.0, 1.2 * expected + 4 * math.sqrt(expected)), 1e7))
        gaps.append(draw(size))
        t = float(np.cumsum(np.concatenate(gaps))[-1])
    times = np.cumsum(np.concatenate(gaps))
    return times[times < duration]


def poisson(
    rate: float,
    n: int | None = None,
    duration: float | None = None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Poisson arrivals at ``rate`` per second: ``n`` of them, or all before ``duration``."""
    return gamma(rate, 1.0, n=n, duration=duration, rng=rng)


def gamma(
    rate: float,
    burstiness: float,
    n: int | None = None,
    duration: float | None = None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Gamma-renewal arrivals with mean gap ``1 / rate`` and CV ``1 / sqrt(burstiness)``."""
    r = _check_positive("rate", rate)
    b = _check_positive("burstiness", burstiness)
    _check_count(n, duration)
    gen = rng if rng is not None else np.random.default_rng(0)
    if b == 1.0:
        return _renewal(lambda size: gen.exponential(1.0 / r, size), 1.0 / r, n, duration)
    return _renewal(lambda size: gen.gamma(b, 1.0 / (r * b), size), 1.0 / r, n, duration)


def all_at_once(n: int) -> np.ndarray:
    """``n`` arrivals, all at t = 0 (offline / batch mode)."""
    _check_count(n, None)
    return np.zeros(int(n))


def make_arrivals(
    kind: str,
    rate: float | None,
    n: int | None = None,
    duration: float | None = None,
    burstiness: float = 1.0,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Dispatch on ``kind`` ("poisson", "gamma", "all_at_once").

    ``rate=None`` means all at once; it needs ``n`` since there is no clock to run out.
    """
    if kind not in ARRIVAL_KINDS:
        raise RequestError(
            f"unknown arrival process {kind!r}; expected one of {', '.join(ARRIVAL_KINDS)}"
        )
    if kind == "all_at_once" or rate is None:
        if n is None:
            raise RequestError(
                "arrivals all at once need num_requests; a duration needs a finite rate"
            )
        return all_at_once(n)
    if kind == "poisson":
        if burstiness != 1.0:
            raise RequestError(
                f"arrival 'poisson' has burstiness 1; got burstiness={burstiness}, "
                "use arrival 'gamma'"
            )
        return poisson(rate, n=n, duration=duration, rng=rng)
    return gamma(rate, burstiness, n=n, duration=duration, rng=rng)
