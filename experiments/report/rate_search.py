"""The sustainable request rate of one system on one setting, for the sharing figures
(Fig. 14, 16, 17): an ascending rate grid that stops after two failing rates (or, while
the grid's top still passes, goes on in steps of 1.5x up to 8x the top), then a bisection
between the highest passing rate and the next failing one.

A run *passes* when its normalized latency (s/token) is at or under the threshold, the
criterion of ``experiments.reproduce``'s Fig. 12. ``run(label, overrides) -> metrics`` is
the caller's runner (a local call or a Hydra launcher job), so the search itself knows
nothing of where runs execute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.search import find_max_rate

Runner = Callable[[str, list[str]], dict[str, Any]]
KEEP = (
    "num_requests", "completed", "normalized_latency", "request_throughput",
    "output_throughput", "mean_batch_size", "num_preemptions", "kv_sharing_saving_pct",
    "kv_token_states_pct",
)  # fmt: skip


def passes(metrics: dict[str, Any], threshold: float) -> bool:
    value = metrics.get("normalized_latency")
    return value is not None and value == value and value <= threshold


def search_rate(
    run: Runner,
    label: str,
    overrides_at: Callable[[float], list[str]],
    rates: Sequence[float],
    threshold: float,
    bisect_evals: int = 3,
) -> list[dict[str, Any]]:
    """Every evaluated rate of one search as a row (``rate``, ``passes`` and :data:`KEEP`),
    in evaluation order. ``overrides_at(rate)`` gives the run's config overrides."""
    rows: list[dict[str, Any]] = []

    def evaluate(rate: float) -> float:
        m = run(f"{label}_rate{rate:.4g}", overrides_at(rate))
        rows.append({"rate": rate, "passes": passes(m, threshold), **{k: m.get(k) for k in KEEP}})
        value = m.get("normalized_latency")
        return float("nan") if value is None else float(value)

    fails = 0
    rate = 0.0
    for rate in rates:
        evaluate(rate)
        fails = 0 if rows[-1]["passes"] else fails + 1
        if fails >= 2:
            break
    while rows[-1]["passes"] and rate < 8 * rates[-1]:  # sustained at the grid's top
        rate *= 1.5
        evaluate(rate)
    ok = [r["rate"] for r in rows if r["passes"]]
    if ok:
        lo = max(ok)
        above = [r["rate"] for r in rows if r["rate"] > lo and not r["passes"]]
        if above and bisect_evals > 0:
            find_max_rate(evaluate, threshold, lo, min(above), rel_tol=0.03,
                          max_evals=bisect_evals, bracket_known=True)  # fmt: skip
    return rows


def max_rate(rows: Sequence[dict[str, Any]]) -> float:
    """The highest passing rate below the first failing one (0 when none passes)."""
    failing = [r["rate"] for r in rows if not r["passes"]]
    first_fail = min(failing) if failing else float("inf")
    ok = [r["rate"] for r in rows if r["passes"] and r["rate"] < first_fail]
    return max(ok) if ok else 0.0


def at_max_rate(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The row of the highest sustained rate (None when none passes)."""
    best = max_rate(rows)
    return next((r for r in rows if r["rate"] == best and r["passes"]), None)


@dataclass(frozen=True)
class Search:
    """One capacity search of a figure: ``setting`` (e.g. "beam 4") and ``system`` name the
    row; ``fixed`` are the config overrides of every run; ``rate_overrides(rate)`` adds the
    rate-dependent ones (picklable, so a process pool can run the search)."""

    figure: str
    setting: str
    system: str
    fixed: tuple[str, ...]
    rates: tuple[float, ...]
    rate_overrides: Callable[[float], list[str]] = field(default=None)  # type: ignore[assignment]

    def overrides(self, rate: float) -> list[str]:
        extra = self.rate_overrides(rate) if self.rate_overrides else [f"workload.rate={rate}"]
        return [*self.fixed, *extra]

    @property
    def label(self) -> str:
        return f"{self.figure}_{self.setting.replace(' ', '')}_{self.system}"


def run_search(run: Runner, search: Search, threshold: float) -> list[dict[str, Any]]:
    """:func:`search_rate` for ``search``; each row also names its setting and system."""
    rows = search_rate(run, search.label, search.overrides, search.rates, threshold)
    return [{"setting": search.setting, "system": search.system, **r} for r in rows]


def capacity_table(rows: Sequence[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """Per (setting, system): the sustained rate and vLLM's rate over it; ``baseline``'s
    row carries vLLM / baseline."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["setting"], r["system"]), []).append(r)
    out = []
    for (setting, system), rs in by.items():
        out.append({"setting": setting, "system": system, "max_rate": max_rate(rs)})
    vllm = {o["setting"]: o["max_rate"] for o in out if o["system"] == "vllm"}
    for o in out:
        base = o["max_rate"]
        o["vllm_ratio"] = vllm.get(o["setting"], float("nan")) / base if base > 0 else float("inf")
    return out
