"""Sustained rates and vLLM's ratios where they may be bounds, for the rate-search figures'
report sections (Fig. 12, 14, 16 and 17): a system that passed every rate tried has only a
lower bound on its rate ("≥"), one that passed none only an upper bound, the lowest rate
tried ("<"); a ratio with such a rate in it is a bound (:func:`ratio_estimate`), every value
it can take given the rates tried is :func:`ratio_bounds`, and its gap to the paper is a
number only where all of those lie on one side of the paper's value, else
:data:`NOT_DECIDED`. Rows are :func:`experiments.report.rate_search.capacity_table`'s."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from experiments.report.paper import SYSTEM_LABELS


def fmt(v: Any, spec: str = ".2f") -> str:
    """``v`` formatted by ``spec``; "—" for None or NaN, "∞" for an infinite float."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return "∞" if isinstance(v, float) and math.isinf(v) else format(v, spec)


# the mark of a value by capacity_table's bound kinds ("unknown" has none: end_text)
BOUND_MARK = {"exact": "", "lower": "≥ ", "upper": "≤ "}


def end_text(value: float, bound: str, spec: str = ".2f") -> str:
    """A value with its bound mark ("≥ 3", "≤ 1.2"; "?" when it may move either way)."""
    return "?" if bound == "unknown" else BOUND_MARK[bound] + fmt(value, spec)


def passed_all(r: Any) -> bool:
    """Every rate tried passed (no failing rate): the rate is only a lower bound."""
    fail = r["first_failing_rate"]
    return r["max_rate"] > 0 and (fail is None or fail != fail)


def ratio_estimate(c: pd.DataFrame, system: str) -> tuple[str, float]:
    """vLLM / ``system`` from their sustainable rates, as (kind, value): "=" both rates
    bracketed (the point ratio of the highest rates that passed); "≥" vLLM passed every
    rate tried, so the ratio is at least vLLM's rate over the lowest rate ``system`` failed
    at; "≤" ``system`` did, so it is at most the lowest rate vLLM failed at over
    ``system``'s; ">" ``system`` passed none (vLLM's rate over the lowest rate it tried);
    "<" vLLM passed none (the lowest rate vLLM tried over ``system``'s rate); "?" no bound
    (both passed every rate, neither passed one, or ``system`` has no rate at all: no trace
    it was given held a request). Every bound holds for any rates the runs allow
    (:func:`ratio_bounds`). (1.0, "=") for vLLM itself."""
    if system == "vllm":
        return "=", 1.0
    v, s = c.loc["vllm"], c.loc[system]
    v_rate, s_rate = float(v["max_rate"]), float(s["max_rate"])
    v_below, s_below = below_grid(v), below_grid(s)
    unmeasured = s_rate <= 0 and not s_below
    if (v_below and s_below) or (passed_all(v) and passed_all(s)) or unmeasured:
        return "?", v_rate / s_rate if s_rate > 0 else math.nan
    if s_below:
        return ">", v_rate / s_below
    if v_below:
        return "<", v_below / s_rate
    bracket = ratio_bounds(c, system)
    assert bracket is not None  # both rows hold numeric rates here
    if passed_all(v):
        return "≥", bracket[0]
    if passed_all(s):
        return "≤", bracket[1]
    return "=", v_rate / s_rate


def ratio_bounds(c: pd.DataFrame, system: str) -> tuple[float, float] | None:
    """Every value vLLM / ``system`` can take given the rates tried, as (low, high), both
    ends excluded: each sustainable rate is at least the highest rate that passed (0 when
    none did) and below the lowest that failed (unbounded when none did), so the ratio is
    above vLLM passed / system failed and below vLLM failed / system passed, with 0 and inf
    where a side is open.
    None when a row is missing or its rate is not a number."""
    if "vllm" not in c.index or system not in c.index:
        return None
    v, s = c.loc["vllm"], c.loc[system]
    if any(x is None or x != x for x in (v["max_rate"], s["max_rate"])):
        return None

    def fail(r: Any) -> float:
        f = r["first_failing_rate"]
        return math.inf if f is None or f != f else float(f)

    v_pass, s_pass = float(v["max_rate"]), float(s["max_rate"])
    low = 0.0 if v_pass == 0 or math.isinf(fail(s)) else v_pass / fail(s)
    high = math.inf if s_pass == 0 or math.isinf(fail(v)) else fail(v) / s_pass
    return low, high


def below_grid(r: Any) -> float | None:
    """The lowest rate tried when no rate passed (the sustainable rate lies below it), else
    None."""
    fail = r["first_failing_rate"]
    if r["max_rate"] > 0 or fail is None or fail != fail:
        return None
    return float(fail)


def why_bound(c: pd.DataFrame, system: str) -> str:
    """Which rates of vLLM / ``system`` are bounds, in words."""
    words = []
    for name in ("vllm", system):
        r = c.loc[name]
        label = SYSTEM_LABELS[name]
        if below_grid(r):
            words.append(f"{label} passed none of the rates tried")
        elif passed_all(r):
            words.append(f"{label} passed every rate tried")
    return " and ".join(words)


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


def rate_text(r: Any, interval: bool = False, spec: str = ".2f") -> str:
    """A sustained rate (formatted by ``spec``) marked where it is a bound: "≥ 8.00"
    (``rate_open``: every rate tried passed), "< 2.00" (none passed: below the lowest rate
    tried, the row's ``first_failing_rate``), else the bare number; with ``interval``, its
    seed interval "[lo, hi]" follows, each end marked likewise (``rate_lo_open``,
    ``rate_hi_open``). ``r``: one :func:`capacity_table` row."""
    below = below_grid(r)

    def end(value: float, is_open: Any) -> str:
        if below and value == 0:  # a seed that passed nothing: below the lowest rate tried
            return f"< {below:{spec}}"
        return end_text(value, "lower" if bool(is_open) else "exact", spec)

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
    if system == "vllm" and below_grid(c.loc["vllm"]):
        return "—"
    kind, value = ratio_estimate(c, system)
    if kind == "?":
        return f"— ({why_bound(c, system)})"
    return ("" if kind == "=" else f"{kind} ") + f"{fmt(value)}×"


def ratio_cell(c: pd.DataFrame, system: str) -> str:
    """:func:`ratio_text` followed, where the ratio is exact, by vLLM's seed interval over
    ``system``'s, each end marked (``ratio_lo_bound``, ``ratio_hi_bound``). A bound (≥, ≤,
    >, <) stands alone: it already holds for every rate the seeds' runs allow, and the
    seeds' point ratios beside it would read as tighter than it. ``c``: as
    :func:`ratio_text`."""
    text = ratio_text(c, system)
    kind, _ = ratio_estimate(c, system)
    if text == "—" or kind != "=":
        return text
    r = c.loc[system]
    lo = end_text(r["ratio_lo"], r["ratio_lo_bound"])
    hi = end_text(r["ratio_hi"], r["ratio_hi_bound"])
    return f"{text} [{lo}, {hi}]"


def gap_text(c: pd.DataFrame, system: str, paper: float) -> str:
    """kvlab's vLLM ÷ ``system`` minus the paper's ``paper``: "+0.58×" where the ratio is
    exact (:func:`ratio_estimate` "=") and every ratio the rates tried allow
    (:func:`ratio_bounds`) lies on one side of ``paper``; where it is only a bound, "≥ +x×"
    or "≤ -x×" when they all lie above or below it; else :data:`NOT_DECIDED`. ``c``: as
    :func:`ratio_text`."""
    kind, value = ratio_estimate(c, system)
    bracket = ratio_bounds(c, system)
    if kind == "=":
        if bracket is not None and bracket[0] < paper < bracket[1]:
            return f"{NOT_DECIDED} ({value - paper:+.2f}× at the rates found)"
        return f"{value - paper:+.2f}×"
    if bracket is None:
        return NOT_DECIDED
    low, high = bracket
    if low > paper:
        return f"≥ {low - paper:+.2f}×"
    if high < paper:
        return f"≤ {high - paper:+.2f}×"
    return NOT_DECIDED
