"""Sustained rates and vLLM's ratios as text where they may be bounds (Fig. 14, 16 and 17's
report sections), on Fig. 12's reading (:mod:`experiments.report.fig12_rates`): a system that
passed every rate tried has only a lower bound on its rate ("≥"), one that passed none only
an upper bound, the lowest rate tried ("<"); a ratio with such a rate in it is a bound, and
its gap to the paper is a number only where every ratio the rates tried allow lies on one
side of the paper's value, else :data:`NOT_DECIDED`."""

from __future__ import annotations

from typing import Any

import pandas as pd

from experiments.report.fig12_rates import (
    _below_grid,
    _end,
    _f,
    _why,
    ratio_bounds,
    ratio_estimate,
)

NOT_DECIDED = "not decided"
BOUNDS_NOTE = (
    "≥ marks a rate that is only a lower bound (the system passed every rate tried), < an "
    "upper one (it passed none: the sustainable rate lies below the lowest rate tried); a "
    "ratio with such a rate in it is a bound (≥, ≤, >, <; — where it is not bounded), and its "
    "gap to the paper is a number only where the rates tried put it on one side of the "
    f"paper's value (else {NOT_DECIDED})."
)


def has_bounds(cap: pd.DataFrame) -> bool:
    """Whether any rate of ``cap`` (:func:`capacity_table` rows), or an end of its seed
    interval, is only a bound: some system passed every rate tried, or none."""
    opened = cap[["rate_open", "rate_lo_open", "rate_hi_open"]].astype(bool).any().any()
    return bool(opened or (cap["max_rate"] == 0).any())


def rate_text(r: Any, interval: bool = False) -> str:
    """A sustained rate (``.2f``) marked where it is a bound: "≥ 8.00" (``rate_open``: every
    rate tried passed), "< 2.00" (none passed: below the lowest rate tried, the row's
    ``first_failing_rate``), else the bare number; with ``interval``, its seed interval
    "[lo, hi]" follows, each end marked likewise (``rate_lo_open``, ``rate_hi_open``). ``r``:
    one :func:`capacity_table` row."""
    below = _below_grid(r)

    def end(value: float, is_open: Any) -> str:
        if below and value == 0:  # a seed that passed nothing: below the lowest rate tried
            return f"< {below:.2f}"
        return _end(value, "lower" if bool(is_open) else "exact")

    head = end(r["max_rate"], r["rate_open"])
    if not interval:
        return head
    return (
        f"{head} [{end(r['rate_lo'], r['rate_lo_open'])}, {end(r['rate_hi'], r['rate_hi_open'])}]"
    )


def ratio_text(c: pd.DataFrame, system: str) -> str:
    """vLLM ÷ ``system`` (``.2f`` and "×") as :func:`ratio_estimate` gives it: the bare
    number where both rates are bracketed, else marked "≥", "≤", ">" or "<", or "— (why)"
    where it is not bounded; "—" on vLLM's own row when vLLM passed no rate. ``c``: one
    setting's :func:`capacity_table` rows indexed by system (a "vllm" row among them)."""
    if system == "vllm" and _below_grid(c.loc["vllm"]):
        return "—"
    kind, value = ratio_estimate(c, system)
    if kind == "?":
        return f"— ({_why(c, system)})"
    return ("" if kind == "=" else f"{kind} ") + f"{_f(value)}×"


def gap_text(c: pd.DataFrame, system: str, paper: float) -> str:
    """kvlab's vLLM ÷ ``system`` minus the paper's ``paper``: "+0.58×" where the ratio is
    exact (:func:`ratio_estimate` "="); where it is only a bound, "≥ +x×" or "≤ -x×" when
    every ratio the rates tried allow (:func:`ratio_bounds`) lies above or below ``paper``,
    else :data:`NOT_DECIDED`. ``c``: as :func:`ratio_text`."""
    kind, value = ratio_estimate(c, system)
    if kind == "=":
        return f"{value - paper:+.2f}×"
    bracket = ratio_bounds(c, system)
    if bracket is None:
        return NOT_DECIDED
    low, high = bracket
    if low > paper:
        return f"≥ {low - paper:+.2f}×"
    if high < paper:
        return f"≤ {high - paper:+.2f}×"
    return NOT_DECIDED
