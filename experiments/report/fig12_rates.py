"""Fig. 12 (a)–(f): normalized latency against request rate, OPT-13B / 66B / 175B on
ShareGPT and Alpaca, each with the paper's GPUs (§6.1: OPT-13B on 1 × A100-40GB, OPT-66B on
4 × A100-40GB, OPT-175B on 8 × A100-80GB; tensor parallelism is ``model.tp`` in
``configs/model``), five systems, every rate on several seeds.

:func:`searches` gives one capacity search (``experiments.report.rate_search``) per panel
and system; :func:`write` turns their rows into each panel's CSV, PNG and PDF, the capacity
table (``fig12_capacity.csv``) and the report section with the paper's ratios beside
kvlab's and a computed gap line per panel.

Choices where the paper is silent (made before any result; config values here):
- the sustained criterion (``rate_search.passes``): on every seed, normalized latency <=
  ``--threshold``, every request completed, and at most :data:`MAX_BACKLOG` of the trace's
  requests were unfinished when its last request arrived (the system kept up: an overload
  of rate/capacity - 1 >= ~11% leaves a larger share queued; a system that keeps up leaves
  about mean latency / trace length; on a trace of fewer than ``BACKLOG_MIN_REQUESTS``
  requests the allowance stays at that share of that many, 10 requests, instead of
  shrinking with the trace). The last condition is what makes a short trace
  honest: on a trace much shorter than the wait 1 s/token allows (a 338-token ShareGPT
  request may wait 338 s), normalized latency alone passes rates the system cannot keep up
  with; it also requires the trace to be >= ~10x the mean latency at the rates found;
- rate grids: fractions of each panel's paper x-axis (:data:`GRID_FRACTIONS`), from 1/16 of
  the axis to twice it, then steps of 1.5x up to 8x the axis while a system still passes;
  the grid stops at the first rate that does not pass (the sustainable rate lies below it;
  runs above it cost the most and cannot change it), then ``bisect_evals`` bisections;
- trace lengths: the paper's (1 hour; 15 minutes for OPT-175B) with ``--full``; by default
  :attr:`Panel.default_s`, scaled so that the trace at the axis's end holds a bounded number
  of requests (the default must finish in minutes on 2 cores) and stays >= 10x a typical
  request's latency at the rates found (ShareGPT requests run for tens of seconds, Alpaca's
  for a few). The report prints, per panel and system, the requests at the rate found and
  the backlog share, so a reader sees whether the trace was long enough.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.report.figures import fig12_panels, save
from experiments.report.paper import FIG12_SHAREGPT_RATIO, SYSTEM_LABELS
from experiments.report.rate_search import (
    BACKLOG_MIN_REQUESTS,
    RATE_TOL,
    Search,
    capacity_table,
    curve_table,
)

SYSTEMS = ("fastertransformer", "orca_max", "orca_pow2", "orca_oracle", "vllm")
MAX_BACKLOG = 0.1
GRID_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1.0, 1.5, 2.0)


@dataclass(frozen=True)
class Panel:
    """One panel of Fig. 12: ``axis`` is the end of the paper's x-axis (req/s); ``full_s``
    the paper's trace length; ``default_s`` the default's (see the module doc)."""

    letter: str
    model: str
    hardware: str
    gpus: int
    workload: str
    axis: float
    full_s: float
    default_s: float

    @property
    def name(self) -> str:
        return f"fig12{self.letter}_{self.model.replace('-', '')}_{self.workload}"

    @property
    def title(self) -> str:
        gpu = self.hardware.upper().replace("A100-", "A100-")
        return f"({self.letter}) {self.model.upper()}, {self.gpus} × {gpu}, {self.workload}"

    @property
    def rates(self) -> tuple[float, ...]:
        return tuple(round(self.axis * f, 6) for f in GRID_FRACTIONS)


PANELS = (
    Panel("a", "opt-13b", "a100-40gb", 1, "sharegpt", 2.0, 3600.0, 400.0),
    Panel("b", "opt-66b", "a100-40gb", 4, "sharegpt", 1.0, 3600.0, 400.0),
    Panel("c", "opt-175b", "a100-80gb", 8, "sharegpt", 2.5, 900.0, 400.0),
    Panel("d", "opt-13b", "a100-40gb", 1, "alpaca", 30.0, 3600.0, 60.0),
    Panel("e", "opt-66b", "a100-40gb", 4, "alpaca", 20.0, 3600.0, 60.0),
    Panel("f", "opt-175b", "a100-80gb", 8, "alpaca", 20.0, 900.0, 60.0),
)
BY_LETTER = {p.letter: p for p in PANELS}


def trace_s(panel: Panel, full: bool, duration: float | None) -> float:
    """The panel's trace length: ``duration`` if given, else the paper's or the default's."""
    return duration or (panel.full_s if full else panel.default_s)


def searches(
    panels: Sequence[Panel], full: bool, duration: float | None, seeds: tuple[int, ...],
    bisect_evals: int, rate_tol: float = RATE_TOL,
) -> list[Search]:  # fmt: skip
    """One search per panel and system; every rate runs once per seed; ``bisect_evals`` and
    ``rate_tol``: :func:`experiments.report.rate_search.search_rate`."""
    out = []
    for p in panels:
        t = trace_s(p, full, duration)
        base = (f"model={p.model}", f"hardware={p.hardware}", f"workload={p.workload}",
                f"workload.duration_s={t}")  # fmt: skip
        for system in SYSTEMS:
            out.append(Search("fig12", p.letter, system, (*base, f"system={system}"), p.rates,
                              seeds=seeds, bisect_evals=bisect_evals, grow_to=4.0,
                              trace_s=t, max_backlog=MAX_BACKLOG,
                              stop_after=1, rate_tol=rate_tol))  # fmt: skip
    return out


def write(rows: Sequence[dict[str, Any]], out: Path, plt: Any, threshold: float) -> str:
    """Per panel ``fig12<letter>_<model>_<workload>.csv`` (every run) and ``.png/.pdf``;
    ``fig12_capacity.csv`` (every panel's sustainable rates), ``fig12_curves.csv`` (mean,
    min and max over seeds per rate) and ``fig12_all_panels.png/.pdf``;
    returns the report section."""
    runs = pd.DataFrame(rows)
    cap = pd.DataFrame(capacity_table(rows, "vllm"))
    curves = pd.DataFrame(curve_table(rows))
    at = _at_rate(runs, cap)
    cap = cap.merge(at, on=["setting", "system"], how="left")
    cap.insert(0, "panel", cap.pop("setting"))
    curves.insert(0, "panel", curves.pop("setting"))
    cap.to_csv(out / "fig12_capacity.csv", index=False)
    curves.to_csv(out / "fig12_curves.csv", index=False)
    letters = [p.letter for p in PANELS if p.letter in set(runs["setting"])]
    for letter in letters:
        p = BY_LETTER[letter]
        runs[runs["setting"] == letter].to_csv(out / f"{p.name}.csv", index=False)
        fig = fig12_panels(curves, cap, threshold, [(letter, p.title, p.axis)])
        save(fig, out, p.name)
        plt.close(fig)
    fig = fig12_panels(curves, cap, threshold, [(x, BY_LETTER[x].title, BY_LETTER[x].axis)
                                                for x in letters])  # fmt: skip
    save(fig, out, "fig12_all_panels")
    plt.close(fig)
    return section(cap, runs, threshold)


def _at_rate(runs: pd.DataFrame, cap: pd.DataFrame) -> pd.DataFrame:
    """Per (panel, system): trace length, and the mean over seeds of the requests, the mean
    end-to-end latency and the backlog share (``unfinished_at_last_arrival``) of the runs
    at the sustainable rate (NaN when no rate passes)."""
    rows = []
    for _, c in cap.iterrows():
        r = runs[(runs["setting"] == c["setting"]) & (runs["system"] == c["system"])]
        at = r[r["rate"] == c["max_rate"]]
        rows.append({
            "setting": c["setting"], "system": c["system"],
            "trace_s": float(r["trace_s"].iloc[0]) if len(r) else math.nan,
            "requests_at_rate": float(at["num_requests"].mean()) if len(at) else math.nan,
            "mean_e2el_s_at_rate": float(at["mean_e2el_ms"].mean()) / 1e3 if len(at) else math.nan,
            "backlog_at_rate": float(at["unfinished_at_last_arrival"].mean())
            if len(at) else math.nan,
        })  # fmt: skip
    return pd.DataFrame(rows)


def _f(v: Any, spec: str = ".2f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return "∞" if isinstance(v, float) and math.isinf(v) else format(v, spec)


def _paper_ratio(panel: Panel, system: str) -> str:
    if system == "vllm":
        return "1"
    if panel.workload != "sharegpt":
        return "not stated"
    lo, hi = FIG12_SHAREGPT_RATIO.get(system, (None, None))
    if hi is None:
        return "not stated"
    return f"up to {hi:g}×" if lo is None else f"{lo:g}–{hi:g}×"


def section(cap: pd.DataFrame, runs: pd.DataFrame, threshold: float) -> str:
    """The report's Fig. 12 section: per panel a table and a computed gap line."""
    seeds = sorted({int(s) for s in runs["seed"].dropna()})
    lines = [
        "## Fig. 12 (a)–(f): sustainable request rate",
        "",
        f"A rate is sustained when, on every seed ({', '.join(map(str, seeds))}), normalized "
        f"latency stays <= {threshold:g} s/token, every request completes and at most "
        f"{MAX_BACKLOG:g} of the trace's requests are unfinished when its last request arrives "
        "(*backlog*; it guards short traces, on which latency alone passes rates the system "
        "cannot keep up with: see `experiments/report/fig12_rates.py`). Search: an "
        "ascending grid of fractions of the paper's x-axis, stopped at the first rate that "
        "does not pass, then bisection. On a trace of fewer than "
        f"{BACKLOG_MIN_REQUESTS} requests the backlog allowed stays at "
        f"{MAX_BACKLOG * BACKLOG_MIN_REQUESTS:g} requests. The "
        "sustainable rate is the highest rate that passes on every seed; [interval] is the "
        "min–max over seeds of each seed's own sustainable rate on the same evaluated rates. "
        "vLLM / system [interval]: vLLM's interval over the system's, low over high and high "
        "over low. The paper's ratios are over three model sizes, for ShareGPT only (§6.2). "
        "Curves: mean over seeds, shaded min–max. Files: `fig12<panel>_*.csv` (every run), "
        "`fig12_curves.csv`, `fig12_capacity.csv`.",
        "",
        "tp > 1 (OPT-66B, OPT-175B) is priced by the same clock: the A100 operator profile "
        "(measured at tp 1) transferred to each GPU's shard by the roofline ratio, plus a "
        "ring all-reduce per layer from the datasheet link bandwidth (`sim/cost/profiled.py`, "
        "`sim/cost/roofline.py`); no tp > 1 step was measured, so the 66B and 175B panels "
        "rest on that transfer.",
        "",
    ]
    gaps = []
    for letter in [p.letter for p in PANELS if p.letter in set(cap["panel"])]:
        p = BY_LETTER[letter]
        c = cap[cap["panel"] == letter].set_index("system")
        t = float(c["trace_s"].dropna().iloc[0]) if c["trace_s"].notna().any() else math.nan
        lines += [
            f"### Fig. 12 {p.title}: trace {t:g} s (paper {p.full_s:g} s), paper's axis "
            f"0–{p.axis:g} req/s",
            "",
            "| system | sustained req/s [interval] | requests at it | mean E2E (s) | backlog "
            "| vLLM / system [interval] | paper |",
            "|---|---|---|---|---|---|---|",
        ]
        for system in [s for s in SYSTEMS if s in c.index]:
            r = c.loc[system]
            below = _below_grid(r)
            rate_cell = (
                f"< {below:.3g} (none of the rates tried passed)"
                if below
                else f"{_f(r['max_rate'], '.3g')} [{_f(r['rate_lo'], '.3g')}, "
                f"{_f(r['rate_hi'], '.3g')}]"
            )
            ratio_cell = (
                f"> {_f(_vllm_rate(c) / below)}×"
                if below
                else f"{_f(r['vllm_ratio'])}× [{_f(r['ratio_lo'])}, {_f(r['ratio_hi'])}]"
            )
            lines.append(
                f"| {SYSTEM_LABELS[system]} | {rate_cell} "
                f"| {_f(r['requests_at_rate'], '.0f')} | {_f(r['mean_e2el_s_at_rate'], '.1f')} "
                f"| {_backlog(r)} | {ratio_cell} | {_paper_ratio(p, system)} |"
            )
        gap = gap_line(p, c)
        gaps.append(gap)
        lines += ["", gap, ""]
    lines += _narrowing(cap)
    return "\n".join(lines) + "\n"


def _below_grid(r: Any) -> float | None:
    """The lowest rate tried when no rate passed (the sustainable rate lies below it), else
    None."""
    fail = r["first_failing_rate"]
    if r["max_rate"] > 0 or fail is None or fail != fail:
        return None
    return float(fail)


def _vllm_rate(c: pd.DataFrame) -> float:
    return float(c.loc["vllm", "max_rate"]) if "vllm" in c.index else math.nan


def _backlog(r: Any) -> str:
    """The backlog cell; flagged where the trace was short (judged against a fixed
    allowance of requests)."""
    n = r["requests_at_rate"]
    short = n == n and n < BACKLOG_MIN_REQUESTS
    most = MAX_BACKLOG * BACKLOG_MIN_REQUESTS
    allowance = f" (< {BACKLOG_MIN_REQUESTS} requests: at most {most:g} unfinished)"
    return _f(r["backlog_at_rate"]) + (allowance if short else "")


def gap_line(panel: Panel, c: pd.DataFrame) -> str:
    """One computed line: vLLM's rate against the paper's axis and each ratio against the
    paper's range (ShareGPT), or the ratios alone (Alpaca: the paper prints none)."""
    parts = []
    if "vllm" in c.index:
        rate = float(c.loc["vllm", "max_rate"])
        where = "inside" if rate <= panel.axis else "beyond"
        parts.append(f"vLLM sustains {rate:.3g} req/s, {where} the paper's axis "
                     f"(0–{panel.axis:g})")  # fmt: skip
    for system in ("orca_oracle", "orca_max", "orca_pow2", "fastertransformer"):
        if system not in c.index:
            continue
        ratio = float(c.loc[system, "vllm_ratio"])
        below = _below_grid(c.loc[system])
        if below:
            parts.append(
                f"{SYSTEM_LABELS[system]} passes none of the rates tried (from {below:.3g} "
                f"req/s), so vLLM / {SYSTEM_LABELS[system]} > {_f(_vllm_rate(c) / below)}×"
            )
            continue
        text = f"vLLM / {SYSTEM_LABELS[system]} = {_f(ratio)}×"
        lo, hi = FIG12_SHAREGPT_RATIO.get(system, (None, None))
        if panel.workload == "sharegpt" and hi is not None:
            lo_ = lo or 1.0
            off = (ratio - hi) if ratio > hi else (ratio - lo_)
            verdict = "inside" if lo_ <= ratio <= hi else f"outside by {off:+.2f}×"
            bracket = resolution_bracket(c, system)
            bounds = [b for b in (lo, hi) if b is not None]  # "up to 22x": no lower bound
            if bracket and any(bracket[0] < b < bracket[1] for b in bounds):
                low, high = (_f(x) for x in bracket)
                verdict += (f"; the search's resolution puts the ratio in [{low}, {high}], "
                            "across the paper's bound: not decided")  # fmt: skip
            text += f" (paper {_paper_ratio(panel, system)}: {verdict})"
        parts.append(text)
    return f"Gap ({panel.letter}): " + "; ".join(parts) + "."


def resolution_bracket(c: pd.DataFrame, system: str) -> tuple[float, float] | None:
    """Where vLLM / ``system`` can lie given the rates tried: each sustainable rate is at
    least the highest rate that passed and below the lowest that failed, so the ratio is in
    [vLLM passed / system failed, vLLM failed / system passed]. None when a failing rate is
    missing (the grid's top passed) or nothing passed."""
    if "vllm" not in c.index or system not in c.index:
        return None
    v, s = c.loc["vllm"], c.loc[system]
    rates = (v["max_rate"], v["first_failing_rate"], s["max_rate"], s["first_failing_rate"])
    if any(r is None or r != r or r <= 0 for r in rates):
        return None
    v_pass, v_fail, s_pass, s_fail = (float(r) for r in rates)
    return v_pass / s_fail, v_fail / s_pass


def _narrowing(cap: pd.DataFrame) -> list[str]:
    """The paper's one Alpaca statement: the gap narrows on OPT-175B (§6.2)."""
    o = cap[(cap["system"] == "orca_oracle")].set_index("panel")["vllm_ratio"]
    if not {"d", "f"} <= set(o.index):
        return []
    d, f = float(o["d"]), float(o["f"])
    verdict = "narrows" if f < d else "does not narrow"
    if f < 1:
        verdict += ", and inverts: Orca (Oracle) sustains more than vLLM on (f)"
    return [f"Alpaca, OPT-175B (f) against OPT-13B (d): vLLM / Orca (Oracle) is {_f(f)}× vs "
            f"{_f(d)}×; kvlab's gap {verdict} (the paper: it narrows, §6.2).", ""]  # fmt: skip
