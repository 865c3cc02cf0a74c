"""The sustainable request rate of one system on one setting: the capacity search of every
rate-based figure of the report (Fig. 12, 14, 16, 17).

One search evaluates each rate on every seed of the search. A run *passes* when its
normalized latency (s/token) is at or under the threshold and every request of its trace
completed (none rejected), and (where the search sets ``max_backlog``) the system kept up
with the arrivals, and (where the search sets ``min_slo_attainment``) enough of its
requests met every SLO (:func:`passes`; :func:`failed_rules` names the rules a run fails,
each row's ``fails_on``); a *rate passes* when every seed's run passes. The search
walks an ascending rate grid and stops after two rates in a row that do not pass (or, while
the grid's top still passes, goes on in steps of 1.5x, the last step cut short so that no
rate exceeds ``grow_to`` times the top), then bisects between the highest passing rate and
the next rate that does not pass.

Aggregation over seeds (:func:`max_rate`, :func:`seed_rates`, :func:`curve_table`): the
sustainable rate is the highest rate that passes on every seed, below the lowest rate that
does not; its interval is the min–max over seeds of each seed's own sustainable rate on the
same evaluated rates (the lower end equals the sustainable rate when each seed's curve is
monotone).

Censoring: a rate is only bracketed (at least the highest rate that passed, below the lowest
that did not) where something failed. A system, or a seed, that passed every rate tried has
only a lower bound (:func:`seed_open`; :func:`capacity_table`'s ``*_open`` columns), and one
that passed none only an upper bound, the lowest rate tried (its rate is reported as 0); a
ratio of such rates is a bound too (``*_bound`` columns).

``run(label, overrides) -> metrics`` is the caller's runner (a local call or a Hydra launcher
job), so the search itself knows nothing of where runs execute.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.metrics.summary import FREE_AT_LIMIT_KEYS
from sim.search import find_max_rate

BACKLOG_MIN_REQUESTS = 100
# the rules a run can fail (failed_rules), in the order a row's ``fails_on`` names them
RULES = ("latency", "incomplete", "backlog", "slo")
# the bisection stops when the rate is bracketed within this share of the failing end
RATE_TOL = 0.03
Runner = Callable[[str, list[str]], dict[str, Any]]
# no wall time: a figure's CSV is the same on every machine
KEEP = (
    "label", "num_requests", "completed", "rejected", "normalized_latency", "offered_rate",
    "request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
    "p99_tpot_ms", "mean_e2el_ms", "mean_batch_size", "num_preemptions", "kv_sharing_saving_pct",
    "kv_token_states_pct", "kv_reserved_pct", "kv_internal_frag_pct", "kv_external_frag_pct",
    "kv_free_at_limit_pct", *FREE_AT_LIMIT_KEYS, "kv_free_pct", "kv_slots", "duration_s",
    "num_steps", "unfinished_at_last_arrival",
)  # fmt: skip
# a run's SLO metrics (a run with slo_ms): kept beside KEEP where the run holds them
SLO_KEEP = ("slo_attainment", "goodput")


def rate_label(rate: float) -> str:
    """``rate`` in a run's label: four significant digits where they name it exactly (1,
    0.5, 3.25), else every digit (a bisected 1.000488…), so two rates never share a run
    folder."""
    short = f"{rate:.4g}"
    return short if float(short) == rate else repr(float(rate))


def failed_rules(
    metrics: dict[str, Any],
    threshold: float,
    max_backlog: float | None = None,
    min_slo_attainment: float | None = None,
) -> tuple[str, ...]:
    """The rules of :data:`RULES` one run fails, in that order (empty: it passes):
    ``latency``, its normalized latency is missing, NaN or above ``threshold``;
    ``incomplete``, a request of its trace did not complete (``completed`` below
    ``num_requests``, e.g. rejected); ``backlog`` (only with ``max_backlog``), it did not keep
    up with the arrivals: the requests unfinished when the last one arrived
    (``unfinished_at_last_arrival`` x requests) are more than ``max_backlog`` of the trace, or
    of :data:`BACKLOG_MIN_REQUESTS` on a shorter trace, where one unfinished request is a
    large share: there the allowance stays at that many requests (10 at 10%) instead of
    shrinking with the trace; ``slo`` (only with ``min_slo_attainment``), the share of its
    requests that met every SLO of the run's ``slo_ms`` (``slo_attainment``, a rejected
    request missing them) is below ``min_slo_attainment``, or missing (None or NaN: the run
    had no ``slo_ms``). A metric that is missing (None, or a NaN backlog) fails no rule but
    ``latency``'s and ``slo``'s."""
    failed = []
    value = metrics.get("normalized_latency")
    if value is None or value != value or value > threshold:
        failed.append("latency")
    n, done = metrics.get("num_requests"), metrics.get("completed")
    if not (n is None or done is None or (n > 0 and done == n)):
        failed.append("incomplete")
    backlog = metrics.get("unfinished_at_last_arrival")
    if not (max_backlog is None or backlog is None or backlog != backlog or n is None):
        share = backlog * n  # an infinite share fails (round() would raise on it)
        unfinished = round(share) if math.isfinite(share) else share
        if unfinished > max_backlog * max(n, BACKLOG_MIN_REQUESTS) + 1e-9:
            failed.append("backlog")
    if min_slo_attainment is not None:
        share = metrics.get("slo_attainment")
        if share is None or share != share or share < min_slo_attainment:
            failed.append("slo")
    return tuple(failed)


def passes(
    metrics: dict[str, Any],
    threshold: float,
    max_backlog: float | None = None,
    min_slo_attainment: float | None = None,
) -> bool:
    """One run passes: it fails none of :func:`failed_rules`' rules (normalized latency <=
    ``threshold``, every request completed, with ``max_backlog`` the system kept up with
    the arrivals, and with ``min_slo_attainment`` at least that share of its requests met
    every SLO)."""
    return not failed_rules(metrics, threshold, max_backlog, min_slo_attainment)


def rules_failed_at(rows: Sequence[dict[str, Any]], rate: float | None) -> tuple[str, ...]:
    """The rules the runs at ``rate`` failed (their ``fails_on``), the union over seeds in
    :data:`RULES`' order; a failed run whose row does not name them (a per-run CSV written
    before the ``fails_on`` column) adds ``"unrecorded"``. Empty when ``rate`` is None or
    no run at it failed."""
    found: set[str] = set()
    for r in rows:
        ok = r.get("passes")
        if rate is None or r["rate"] != rate or ok is None or ok:
            continue
        named = r.get("fails_on")
        found |= set(named.split("+")) if isinstance(named, str) and named else {"unrecorded"}
    return tuple(n for n in (*RULES, "unrecorded") if n in found)


def search_rate(
    run: Runner,
    label: str,
    overrides_at: Callable[[float, int | None], list[str]],
    rates: Sequence[float],
    threshold: float,
    seeds: Sequence[int | None] = (None,),
    bisect_evals: int = 3,
    grow_to: float = 8.0,
    trace_s: float | None = None,
    max_backlog: float | None = None,
    stop_after: int = 2,
    rate_tol: float = RATE_TOL,
    min_slo_attainment: float | None = None,
) -> list[dict[str, Any]]:
    """Every run of one search as a row (``rate``, ``seed``, ``passes``, ``fails_on``,
    ``trace_s`` and :data:`KEEP`, with :data:`SLO_KEEP` where the run's metrics hold
    ``slo_attainment``), in evaluation order; ``fails_on`` names the rules the run
    failed (:func:`failed_rules`) joined by "+", "" when it passes, None (as ``passes``) when
    its trace held no request. ``overrides_at(rate, seed)`` gives
    the run's config overrides (``seed`` None: the caller's overrides fix the seed).
    ``bisect_evals`` rates at most are bisected, until the highest passing and the lowest
    failing rate are within ``rate_tol`` of the latter; ``max_backlog``,
    ``min_slo_attainment``: :func:`passes`; the grid
    stops after ``stop_after`` rates in a row that do not pass; while the grid's top passes,
    rates grow by 1.5x up to ``grow_to`` x the top and no further (the last step is shorter);
    ``trace_s``: the trace length, recorded in each row."""
    rows: list[dict[str, Any]] = []

    def evaluate(rate: float) -> bool | None:
        ok: bool | None = True
        for seed in seeds:
            suffix = "" if seed is None else f"_seed{seed}"
            run_label = f"{label}_rate{rate_label(rate)}{suffix}"
            m = run(run_label, overrides_at(rate, seed))
            measured = m.get("num_requests") != 0
            failed = (
                failed_rules(m, threshold, max_backlog, min_slo_attainment) if measured else None
            )
            ok_run = None if failed is None else not failed
            fails_on = None if failed is None else "+".join(failed)
            row = {"rate": rate, "seed": seed, "passes": ok_run, "fails_on": fails_on}
            slo = {k: m.get(k) for k in SLO_KEEP} if "slo_attainment" in m else {}
            rows.append(row | {"trace_s": trace_s, **{k: m.get(k) for k in KEEP}} | slo
                        | {"label": run_label})  # fmt: skip
            ok = None if ok is None or not measured else ok and row["passes"]
        return ok

    fails = 0
    rate = 0.0
    last_ok: bool | None = False
    for rate in rates:
        last_ok = evaluate(rate)
        if last_ok is None:
            continue  # a trace without a request at this rate: not measured
        fails = 0 if last_ok else fails + 1
        if fails >= stop_after:
            break
    ceiling = grow_to * rates[-1]
    while last_ok and rate < ceiling:  # sustained at the grid's top
        rate = min(rate * 1.5, ceiling)
        last_ok = evaluate(rate)
    lo = max_rate(rows)
    above = [r for r in _rate_passes(rows) if r > lo and not _rate_passes(rows)[r]]
    if lo > 0 and above and bisect_evals > 0:
        # find_max_rate wants a value and a threshold: 0 passes, 1 fails (at threshold 0.5).
        find_max_rate(lambda r: 0.0 if evaluate(r) else 1.0, 0.5, lo, min(above),
                      rel_tol=rate_tol, max_evals=bisect_evals,
                      bracket_known=True)  # fmt: skip
    return rows


def _rate_passes(rows: Sequence[dict[str, Any]]) -> dict[float, bool]:
    """Per measured rate: does every run at it pass? A rate where some run failed does not;
    one where none failed but some seed's trace held no request (``passes`` None) is not
    measured, and left out."""
    by_rate: dict[float, list[bool | None]] = {}
    for r in rows:
        by_rate.setdefault(r["rate"], []).append(r["passes"])
    out: dict[float, bool] = {}
    for rate, results in by_rate.items():
        if any(p is not None and not p for p in results):
            out[rate] = False
        elif all(p is not None for p in results):
            out[rate] = True
    return out


def max_rate(rows: Sequence[dict[str, Any]]) -> float:
    """The highest rate that passes on every seed, below the lowest rate that does not
    (0 when none passes)."""
    by_rate = _rate_passes(rows)
    failing = [r for r, ok in by_rate.items() if not ok]
    first_fail = min(failing) if failing else math.inf
    ok = [r for r, good in by_rate.items() if good and r < first_fail]
    return max(ok) if ok else 0.0


def first_failing_rate(rows: Sequence[dict[str, Any]]) -> float | None:
    """The lowest evaluated rate that does not pass on every seed (None when all pass)."""
    failing = [r for r, ok in _rate_passes(rows).items() if not ok]
    return min(failing) if failing else None


def seed_rates(rows: Sequence[dict[str, Any]]) -> dict[Any, float]:
    """Per seed: its own sustainable rate (:func:`max_rate` on that seed's runs)."""
    seeds = dict.fromkeys(r.get("seed") for r in rows)
    return {s: max_rate([r for r in rows if r.get("seed") == s]) for s in seeds}


def seed_open(rows: Sequence[dict[str, Any]]) -> dict[Any, bool]:
    """Per seed: True when none of its measured runs failed, so its own rate
    (:func:`seed_rates`) is only a lower bound on where it would fail (censored)."""
    seeds = dict.fromkeys(r.get("seed") for r in rows)
    return {s: first_failing_rate([r for r in rows if r.get("seed") == s]) is None for s in seeds}


def at_max_rate(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The runs at the sustainable rate as one row: numbers averaged over seeds, leaving out a
    seed's None or NaN (a quantity its run could not measure, e.g. a saving with no block
    held; as :func:`curve_table` does), ``seeds`` the number of runs (None when no rate
    passes)."""
    best = max_rate(rows)
    at = [r for r in rows if r["rate"] == best and r["passes"]]
    if not at:
        return None
    out = dict(at[0])
    for key, value in at[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool) and key != "seed":
            vals = [r[key] for r in at if r.get(key) is not None and r[key] == r[key]]
            out[key] = sum(vals) / len(vals) if vals else None
    out["seeds"] = len(at)
    return out


@dataclass(frozen=True)
class Search:
    """One capacity search of a figure: ``setting`` (e.g. "beam 4") and ``system`` name the
    row; ``fixed`` are the config overrides of every run; ``rate_overrides(rate)`` adds the
    rate-dependent ones (picklable, so a process pool can run the search); ``seeds``: each
    rate runs once per seed (None: ``fixed`` sets the seed); ``min_slo_attainment``: the
    ``slo`` rule's share (None: no such rule)."""

    figure: str
    setting: str
    system: str
    fixed: tuple[str, ...]
    rates: tuple[float, ...]
    rate_overrides: Callable[[float], list[str]] = field(default=None)  # type: ignore[assignment]
    seeds: tuple[int, ...] | None = None
    bisect_evals: int = 3
    grow_to: float = 8.0
    trace_s: float | None = None
    max_backlog: float | None = None
    stop_after: int = 2
    rate_tol: float = RATE_TOL
    min_slo_attainment: float | None = None

    def overrides(self, rate: float, seed: int | None = None) -> list[str]:
        extra = self.rate_overrides(rate) if self.rate_overrides else [f"workload.rate={rate}"]
        return [*self.fixed, *extra, *([] if seed is None else [f"seed={seed}"])]

    @property
    def label(self) -> str:
        return f"{self.figure}_{self.setting.replace(' ', '')}_{self.system}"


def run_search(run: Runner, search: Search, threshold: float) -> list[dict[str, Any]]:
    """:func:`search_rate` for ``search``; each row also names its setting and system."""
    rows = search_rate(
        run, search.label, search.overrides, search.rates, threshold,
        seeds=search.seeds or (None,), bisect_evals=search.bisect_evals, grow_to=search.grow_to,
        trace_s=search.trace_s, max_backlog=search.max_backlog,
        stop_after=search.stop_after, rate_tol=search.rate_tol,
        min_slo_attainment=search.min_slo_attainment,
    )  # fmt: skip
    return [{"setting": search.setting, "system": search.system, **r} for r in rows]


def capacity_table(rows: Sequence[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """Per (setting, system): the sustainable rate (``max_rate``), its seed interval
    (``rate_lo``, ``rate_hi``), the lowest rate that failed, the seeds, and vLLM's rate over
    it (``vllm_ratio``, 1 on vLLM's own row; ``ratio_lo``/``ratio_hi``: vLLM's interval over
    this one's, its lowest over this one's highest and back; a ratio with a zero denominator
    is inf, or NaN when the numerator is zero too). ``baseline`` names the figure's
    reference.

    Censoring (the numeric columns keep the meaning above; these say which are bounds):
    ``rate_open`` True when every rate tried passed, so ``max_rate`` is only a lower bound;
    ``rate_lo_open``/``rate_hi_open`` True when that end of the seed interval comes from
    seeds that never failed (:func:`seed_open`), a lower bound likewise.
    ``vllm_ratio_bound``, ``ratio_lo_bound``, ``ratio_hi_bound``: "exact" (every rate in it
    bracketed by a pass and a failure), "lower" (the true ratio may only be higher: the
    numerator is open, or 0 because nothing passed), "upper" (may only be lower: the
    denominator is), "unknown" (both)."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["setting"], r["system"]), []).append(r)
    out = []
    for (setting, system), rs in by.items():
        per_seed, open_ = seed_rates(rs), seed_open(rs)
        lo, hi = min(per_seed.values()), max(per_seed.values())
        fail = first_failing_rate(rs)
        out.append({
            "setting": setting, "system": system, "max_rate": max_rate(rs),
            "rate_lo": lo, "rate_hi": hi, "first_failing_rate": fail, "seeds": len(per_seed),
            "rate_open": fail is None and max_rate(rs) > 0,
            "rate_lo_open": all(open_[s] for s, r in per_seed.items() if r == lo),
            "rate_hi_open": any(open_.values()),
        })  # fmt: skip
    vllm = {o["setting"]: o for o in out if o["system"] == "vllm"}
    for o in out:
        v = vllm.get(o["setting"]) or {}
        ratios = (("vllm_ratio", "max_rate", "max_rate", "rate_open", "rate_open"),
                  ("ratio_lo", "rate_lo", "rate_hi", "rate_lo_open", "rate_hi_open"),
                  ("ratio_hi", "rate_hi", "rate_lo", "rate_hi_open", "rate_lo_open"))  # fmt: skip
        for name, num, den, num_open, den_open in ratios:
            o[name] = _ratio(v.get(num, math.nan), o[den])
            o[f"{name}_bound"] = (
                _bound(_may_be_higher(v[num], v[num_open]), _may_be_higher(o[den], o[den_open]))
                if v
                else "unknown"
            )
        if o["system"] == "vllm":
            o["vllm_ratio"], o["vllm_ratio_bound"] = 1.0, "exact"
    return out


def _ratio(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return math.inf if num > 0 else math.nan


def _may_be_higher(rate: float, is_open: bool) -> bool:
    """Whether the true rate may lie above ``rate``: it is open (nothing failed), or 0
    (nothing passed: only below the lowest rate tried is known)."""
    return bool(is_open) or rate == 0


def _bound(num_higher: bool, den_higher: bool) -> str:
    """How a ratio relates to the true one when its numerator or denominator may be higher:
    "exact", "lower" (the ratio is a lower bound), "upper" or "unknown"."""
    if num_higher and den_higher:
        return "unknown"
    return "lower" if num_higher else "upper" if den_higher else "exact"


def curve_table(rows: Sequence[dict[str, Any]], value: str = "normalized_latency") -> list[dict]:
    """Per (setting, system, rate): ``value``'s mean, min and max over seeds, the number of
    seeds, whether the rate passes on every seed (``passes``) and whether one failed
    (``failed``; neither where no seed failed but one is unmeasured: :func:`max_rate`
    leaves such a rate out); sorted by rate, then setting and system, so the order does not
    depend on the order of ``rows``."""
    by: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["setting"], r["system"], r["rate"]), []).append(r)
    out = []
    for (setting, system, rate), rs in sorted(by.items(), key=lambda kv: (kv[0][2], *kv[0][:2])):
        verdict = _rate_passes(rs).get(rate)  # None: unmeasured on a seed, none failed
        vals = [float(r[value]) for r in rs if r.get(value) is not None]
        vals = [v for v in vals if v == v]
        out.append({
            "setting": setting, "system": system, "rate": rate, "seeds": len(rs),
            f"{value}_mean": sum(vals) / len(vals) if vals else math.nan,
            f"{value}_min": min(vals) if vals else math.nan,
            f"{value}_max": max(vals) if vals else math.nan,
            "passes": verdict is True,
            "failed": verdict is False,
            "num_requests_mean": sum(r.get("num_requests") or 0 for r in rs) / len(rs),
        })  # fmt: skip
    return out
