"""Capacity search: the highest request rate a system sustains.

"Sustains" means a latency statistic (by default the paper's normalized latency, s/token)
stays at or under a threshold; or, with SLOs, that the SLO attainment stays at or above a
target. The statistic is assumed to grow with the rate (queueing makes it explode past
saturation); the search brackets the crossing and bisects it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class SearchResult:
    max_rate: float  # highest rate found to pass (0.0 if even ``lo`` fails)
    first_failing_rate: float | None  # lowest rate found to fail (None if ``hi`` passes)
    evaluations: list[tuple[float, float]] = field(default_factory=list)  # (rate, value)


def find_max_rate(
    evaluate: Callable[[float], float],
    threshold: float,
    lo: float,
    hi: float,
    rel_tol: float = 0.02,
    max_evals: int = 12,
    higher_is_better: bool = False,
    bracket_known: bool = False,
) -> SearchResult:
    """Bisect for the largest rate in ``[lo, hi]`` whose ``evaluate(rate)`` passes.

    Passing means ``value <= threshold`` (or ``>=`` with ``higher_is_better``, e.g. SLO
    attainment). Stops when the bracket is within ``rel_tol`` of its upper end or after
    ``max_evals`` evaluations. A NaN value (nothing finished) counts as failing.
    ``bracket_known`` skips evaluating the ends: the caller already knows ``lo`` passes
    and ``hi`` fails (then one evaluation, the midpoint, is a search; else two, the ends).
    """
    if not 0 < lo < hi:
        raise ValueError(f"need 0 < lo < hi, got lo={lo}, hi={hi}")
    least = 1 if bracket_known else 2
    if rel_tol <= 0 or max_evals < least:
        raise ValueError(f"rel_tol must be > 0 and max_evals >= {least}")
    evals: list[tuple[float, float]] = []

    def passes(rate: float) -> bool:
        value = evaluate(rate)
        evals.append((rate, value))
        if value != value:  # NaN
            return False
        return value >= threshold if higher_is_better else value <= threshold

    if not bracket_known:
        if passes(hi):
            return SearchResult(hi, None, evals)
        if not passes(lo):
            return SearchResult(0.0, lo, evals)
    good, bad = lo, hi
    while len(evals) < max_evals and (bad - good) > rel_tol * bad:
        mid = 0.5 * (good + bad)
        if passes(mid):
            good = mid
        else:
            bad = mid
    return SearchResult(good, bad, evals)
