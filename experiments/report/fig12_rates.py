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
  the axis to twice it, then steps of 1.5x up to 8x the axis (:data:`GROW_TO` x the grid's
  top; the last step is cut short, so no rate above 8x is run) while a system still passes;
  the grid stops at the first rate that does not pass (the sustainable rate lies below it;
  runs above it cost the most and cannot change it), then ``bisect_evals`` bisections;
- trace lengths: the paper's (1 hour; 15 minutes for OPT-175B) with ``--full``; by default
  :attr:`Panel.default_s`, scaled so that the trace at the axis's end holds a bounded number
  of requests (the default must finish in minutes on 2 cores) and stays >= 10x a typical
  request's latency at the rates found (ShareGPT requests run for tens of seconds, Alpaca's
  for a few). The report prints, per panel and system, the requests at the rate found and
  the backlog share, so a reader sees whether the trace was long enough.

Bounds: a system that passed every rate tried has only a lower bound on its rate (printed
"≥"), one that passed none only an upper bound (the lowest rate tried, "<"); a seed's own
rate likewise marks its interval end. A ratio with such a rate in it is a bound ("≥", "≤",
">", "<"), and the gap line calls such a ratio inside or outside the paper's range only when
every ratio the rates tried allow (:func:`ratio_bounds`) is inside it, or all on one side.

``python -m experiments.report.fig12_rates DIR`` prints the section again from the per-run
CSVs of a finished run in ``DIR`` (no simulation; ``--write-capacity`` also rewrites its
``fig12_capacity.csv``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.lib.args import OneLineParser
from experiments.lib.checks import ConfigError
from experiments.lib.cli import plain_cli
from experiments.lib.results import write_csv
from experiments.report.bound_text import (
    below_grid,
    fmt,
    passed_all,
    rate_text,
    ratio_bounds,
    ratio_cell,
    ratio_estimate,
    why_bound,
)
from experiments.report.fig12_mix import lines as mix_lines
from experiments.report.fig12_mix import mix_table, read_fig12_csv, read_mix
from experiments.report.figures import fig12_panels, save
from experiments.report.paper import FIG12_SHAREGPT_RATIO, SYSTEM_LABELS
from experiments.report.rate_search import (
    BACKLOG_MIN_REQUESTS,
    RATE_TOL,
    Search,
    capacity_table,
    curve_table,
)
from experiments.report.tables import markdown_rows

SYSTEMS = ("fastertransformer", "orca_max", "orca_pow2", "orca_oracle", "vllm")
MAX_BACKLOG = 0.1
GRID_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1.0, 1.5, 2.0)
# growth above the grid's top (2x the axis) stops at this multiple of it: 8x the axis
GROW_TO = 4.0
MIX_FILE = "fig12_step_mix.csv"  # the Alpaca panels' step mix (experiments.report.fig12_mix)
# the columns of ``rate_search.capacity_table`` that say which rates and ratios are bounds
BOUND_COLUMNS = ("rate_open", "rate_lo_open", "rate_hi_open", "vllm_ratio_bound",
                 "ratio_lo_bound", "ratio_hi_bound")  # fmt: skip


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
                              seeds=seeds, bisect_evals=bisect_evals, grow_to=GROW_TO,
                              trace_s=t, max_backlog=MAX_BACKLOG,
                              stop_after=1, rate_tol=rate_tol))  # fmt: skip
    return out


def write(
    rows: Sequence[dict[str, Any]], out: Path, plt: Any, threshold: float,
    clocks: Mapping[str, str] | None = None, mix_rows: Sequence[dict[str, Any]] = (),
) -> str:  # fmt: skip
    """Per panel ``fig12<letter>_<model>_<workload>.csv`` (every run) and ``.png/.pdf``;
    ``fig12_capacity.csv`` (every panel's sustainable rates and ``threshold``, the
    normalized-latency bound the runs were judged by), ``fig12_curves.csv`` (mean,
    min and max over seeds per rate), ``fig12_all_panels.png/.pdf`` and, given
    ``mix_rows`` (``fig12_mix.mix_row``), ``fig12_step_mix.csv``; returns the report
    section (``clocks``: :func:`section`)."""
    runs = pd.DataFrame(rows)
    cap = capacity(rows, threshold)
    curves = panel_curves(rows)
    mix = mix_table(mix_rows) if mix_rows else None
    write_csv(out / "fig12_capacity.csv", cap)
    write_csv(out / "fig12_curves.csv", curves)
    if mix is not None:
        write_csv(out / MIX_FILE, mix)
    for p in [p for p in PANELS if p.letter in set(runs["setting"])]:
        write_csv(out / f"{p.name}.csv", runs[runs["setting"] == p.letter])
    draw(cap, curves, out, plt, threshold)
    return section(cap, runs, threshold, clocks, mix)


def draw(cap: pd.DataFrame, curves: pd.DataFrame, out: Path, plt: Any, threshold: float) -> None:
    """``fig12<letter>_<model>_<workload>.png/.pdf`` per panel in ``cap`` and
    ``fig12_all_panels.png/.pdf`` (:func:`experiments.report.figures.fig12_panels`)."""
    letters = [p.letter for p in PANELS if p.letter in set(cap["panel"])]
    for letter in letters:
        p = BY_LETTER[letter]
        fig = fig12_panels(curves, cap, threshold, [(letter, p.title, p.axis)])
        save(fig, out, p.name)
        plt.close(fig)
    fig = fig12_panels(curves, cap, threshold, [(x, BY_LETTER[x].title, BY_LETTER[x].axis)
                                                for x in letters])  # fmt: skip
    save(fig, out, "fig12_all_panels")
    plt.close(fig)


def panel_curves(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """``fig12_curves.csv``'s table: ``rate_search.curve_table`` with ``panel`` first."""
    curves = pd.DataFrame(curve_table(rows))
    curves.insert(0, "panel", curves.pop("setting"))
    return curves


def capacity(rows: Sequence[dict[str, Any]], threshold: float | None = None) -> pd.DataFrame:
    """``fig12_capacity.csv``'s table: ``rate_search.capacity_table`` (with its bound
    columns) and :func:`_at_rate`'s columns per (panel, system), ``panel`` first; last, a
    ``threshold`` column holding ``threshold`` (s/token, the ``--threshold`` the runs were
    judged by) on every row, unless it is None."""
    runs = pd.DataFrame(rows)
    cap = pd.DataFrame(capacity_table(rows, "vllm"))
    cap = cap.merge(_at_rate(runs, cap), on=["setting", "system"], how="left")
    cap.insert(0, "panel", cap.pop("setting"))
    if threshold is not None:
        cap["threshold"] = threshold
    return cap


def recorded_threshold(cap: pd.DataFrame, path: Path) -> float:
    """The threshold (s/token) the ``fig12_capacity.csv`` at ``path`` (read as ``cap``)
    records: its ``threshold`` column, one number > 0 on every row. A ConfigError naming
    ``path`` when the column is missing (a file written before it existed: the line names
    the command that rebuilds it) or holds anything else."""
    if "threshold" not in cap.columns:
        fix = f"python -m experiments.report.fig12_rates {path.parent} --write-capacity"
        raise ConfigError(str(path), "no column threshold (written before reproduce recorded "
                          f"its --threshold): rebuild it with `{fix} --threshold T`, T the "
                          "run's --threshold")  # fmt: skip
    values = set(pd.to_numeric(cap["threshold"], errors="coerce"))
    value = values.pop() if len(values) == 1 else math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(str(path), "column threshold: not one number > 0 on every row")
    return float(value)


def check_curves(curves: pd.DataFrame, threshold: float, path: Path) -> None:
    """A ConfigError naming ``path`` (``fig12_curves.csv``, read as ``curves``) and its
    first row that passes with a normalized latency (max over seeds) above ``threshold``:
    a run that passes met the threshold, so the curves and the capacity table that records
    ``threshold`` come from different runs."""
    passing = curves["passes"].astype(str) == "True"
    over = curves.index[passing & (curves["normalized_latency_max"] > threshold)]
    for row in over[:1]:
        raise ConfigError(str(path), f"line {row + 2} passes with normalized_latency_max "
                          f"{curves.loc[row, 'normalized_latency_max']:g}, above the threshold "
                          f"{threshold:g} s/token that fig12_capacity.csv records: the two "
                          "files come from different runs")  # fmt: skip


# The columns of a per-run CSV that the capacities, curves and section read.
RUN_COLUMNS = ("setting", "system", "rate", "seed", "passes", "trace_s", "num_requests",
               "normalized_latency", "mean_e2el_ms", "unfinished_at_last_arrival")  # fmt: skip


def _read_panel(path: Path) -> pd.DataFrame:
    """One panel's per-run CSV; a ConfigError naming the file when it is empty, not CSV or
    lacks a column of :data:`RUN_COLUMNS`."""
    return read_fig12_csv(path, RUN_COLUMNS, "per-run")


def read_runs(directory: Path) -> list[dict[str, Any]]:
    """The rows of every panel's per-run CSV (``fig12<letter>_*.csv``) in ``directory``, as
    the search made them: ``seed`` None where empty, ``passes`` None where not measured,
    ``fails_on`` "" where the run passed (None where a failed run has none, as in a CSV
    written before the column; absent where no file has the column). A
    ConfigError names the folder when it holds none, or the file that is not one."""
    if not directory.is_dir():
        raise ConfigError(str(directory), "no such folder")
    frames = [_read_panel(directory / f"{p.name}.csv") for p in PANELS
              if (directory / f"{p.name}.csv").is_file()]  # fmt: skip
    if not frames:
        names = ", ".join(f"{p.name}.csv" for p in PANELS)
        raise ConfigError(str(directory), "holds no Fig. 12 per-run CSV", expected=names)
    rows = pd.concat(frames, ignore_index=True).to_dict("records")
    for r in rows:
        r["setting"] = str(r["setting"])
        r["seed"] = None if r["seed"] != r["seed"] else int(r["seed"])
        ok = r["passes"]
        r["passes"] = None if ok is None or ok != ok else ok in (True, "True", "true", 1)
        named = r.get("fails_on")  # a CSV written before the column has none
        if "fails_on" in r and not isinstance(named, str):  # read as NaN: "" or unrecorded
            r["fails_on"] = "" if r["passes"] else None
    return rows


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


def _paper_ratio(panel: Panel, system: str) -> str:
    if system == "vllm":
        return "1"
    if panel.workload != "sharegpt":
        return "not stated"
    lo, hi = FIG12_SHAREGPT_RATIO.get(system, (None, None))
    if hi is None:
        return "not stated"
    return f"up to {hi:g}×" if lo is None else f"{lo:g}–{hi:g}×"


def section(
    cap: pd.DataFrame, runs: pd.DataFrame, threshold: float,
    clocks: Mapping[str, str] | None = None, mix: pd.DataFrame | None = None,
) -> str:  # fmt: skip
    """The report's Fig. 12 section: per panel a table and a computed gap line. ``cap``:
    :func:`capacity` (a table without its bound columns, such as a ``fig12_capacity.csv``
    written before they existed, raises ``ValueError``: rebuild it from the runs).
    ``clocks``: per panel letter, the lines of its cost model's description that the
    report's *Cost model* section does not print (empty: the same clock), shown under the
    panel's heading. ``mix``: ``fig12_step_mix.csv``'s rows, for the Alpaca lines of
    :func:`experiments.report.fig12_mix.lines` (None: their memory part only)."""
    missing = [col for col in BOUND_COLUMNS if col not in cap.columns]
    if missing:
        raise ValueError(f"capacity table lacks {', '.join(missing)}: rebuild it with "
                         "fig12_rates.capacity(rows) from the per-run CSVs")  # fmt: skip
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
        "over low. ≥ marks a lower bound (a system, or the seed behind an interval end, "
        "that passed every rate tried), < an upper one (none passed: below the lowest rate "
        "tried); a ratio with such a rate in it is a bound (≥, ≤, >, <; ? where it may move "
        "either way), and the gap line decides inside or outside the paper's range only "
        "where every ratio the rates tried allow lies on one side. The paper's ratios are "
        "over three model sizes, for ShareGPT only (§6.2). "
        "Curves: mean over seeds, shaded min–max. Files: `fig12<panel>_*.csv` (every run), "
        "`fig12_curves.csv`, `fig12_capacity.csv`.",
        "",
        "tp > 1 (OPT-66B, OPT-175B) is priced by the same clock: the A100 operator profile "
        "(measured at tp 1) transferred to each GPU's shard (matmuls by the roofline ratio, "
        "elementwise operators by the elements a token moves on one GPU, each beyond a fixed "
        "part fitted on another model's tables), plus two ring all-reduces per layer at the "
        "latency and fraction of the NVLink's bandwidth fitted on Vidur's A100 all-reduce "
        "table and, in the paper-era stack, the driver's Ray calls to its workers from "
        "Vidur's CPU table (`sim/cost/profiled.py`, `sim/cost/roofline.py`, "
        "`sim/cost/overhead.py`). No serving step at tp > 1 was measured, so the 66B and 175B "
        "panels rest on that transfer. Held against Vidur's measured A100 layers at tp 2-8 "
        "(`docs/validation/profile-transfer.md`), it prices a layer within 5% (mean absolute "
        "error) on shards at least the profiled layer's size, as these panels' are; on "
        "smaller shards (Llama-2-7B at tp 2-8) the layer comes out within -4.9% to +0.7% at "
        "1-64 tokens. The all-reduce's fit is held out on the table's own middle sizes and "
        "4-GPU rows (`docs/validation/allreduce.md`); at tp > 1 it was not checked against "
        "a serving run.",
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
            *_clock_lines(clocks, letter),
            *markdown_rows(panel_table(p, c)),
        ]
        gap = gap_line(p, c)
        gaps.append(gap)
        lines += ["", gap, ""]
    lines += _narrowing(cap)
    lines += mix_lines(runs, cap, mix)
    return "\n".join(lines) + "\n"


TABLE_COLUMNS = ("sustained req/s [interval]", "requests at it", "mean E2E (s)", "backlog",
                 "vLLM / system [interval]", "paper")  # fmt: skip


def panel_table(panel: Panel, c: pd.DataFrame) -> pd.DataFrame:
    """The report's table of one panel: per system of ``c`` (the panel's :func:`capacity`
    rows indexed by system; in :data:`SYSTEMS`' order), indexed by its label, the text
    cells of :data:`TABLE_COLUMNS`, rates and ratios that are only bounds marked
    (:func:`_rate_cell`, ``bound_text.ratio_cell``)."""
    rows = {}
    for system in [s for s in SYSTEMS if s in c.index]:
        r = c.loc[system]
        rows[SYSTEM_LABELS[system]] = [
            _rate_cell(r), fmt(r["requests_at_rate"], ".0f"), fmt(r["mean_e2el_s_at_rate"], ".1f"),
            _backlog(r), ratio_cell(c, system), _paper_ratio(panel, system),
        ]  # fmt: skip
    table = pd.DataFrame.from_dict(rows, orient="index", columns=list(TABLE_COLUMNS))
    return table.rename_axis("system")


def capacity_view(cap: pd.DataFrame) -> pd.DataFrame:
    """Every panel's :func:`panel_table` of ``cap`` (:func:`capacity`), in panel order,
    indexed by (panel letter, system label)."""
    letters = [p.letter for p in PANELS if p.letter in set(cap["panel"])]
    return pd.concat({x: panel_table(BY_LETTER[x], cap[cap["panel"] == x].set_index("system"))
                      for x in letters}, names=["panel"])  # fmt: skip


def _clock_lines(clocks: Mapping[str, str] | None, letter: str) -> list[str]:
    if clocks is None or letter not in clocks:
        return []
    if not clocks[letter].strip():
        return ["Clock: the one under *Cost model*.", ""]
    return ["Clock: as under *Cost model*, except:", "", "```", clocks[letter], "```", ""]


def _rate_cell(r: Any) -> str:
    """The sustained-rate cell: the rate and its seed interval, open ends marked "≥"."""
    below = below_grid(r)
    if below:
        return f"< {below:.3g} (none of the rates tried passed)"
    suffix = " (passed every rate tried)" if r["rate_open"] else ""
    return rate_text(r, interval=True, spec=".3g") + suffix


def _backlog(r: Any) -> str:
    """The backlog cell; flagged where the trace was short (judged against a fixed
    allowance of requests)."""
    n = r["requests_at_rate"]
    short = n == n and n < BACKLOG_MIN_REQUESTS
    most = MAX_BACKLOG * BACKLOG_MIN_REQUESTS
    allowance = f" (< {BACKLOG_MIN_REQUESTS} requests: at most {most:g} unfinished)"
    return fmt(r["backlog_at_rate"]) + (allowance if short else "")


def gap_line(panel: Panel, c: pd.DataFrame) -> str:
    """One computed line: vLLM's rate against the paper's axis and each ratio against the
    paper's range (ShareGPT), or the ratios alone (Alpaca: the paper prints none). A rate
    or ratio that is only a bound is printed as one (:func:`ratio_estimate`); its verdict is
    "inside" or "outside" only when every value :func:`ratio_bounds` allows is, else "not
    decided". ``c``: one panel's capacity rows indexed by system (``max_rate``,
    ``first_failing_rate``)."""
    parts = []
    if "vllm" in c.index:
        parts.append(_vllm_part(panel, c.loc["vllm"]))
    for system in ("orca_oracle", "orca_max", "orca_pow2", "fastertransformer"):
        if system not in c.index or "vllm" not in c.index:
            continue
        label = SYSTEM_LABELS[system]
        kind, ratio = ratio_estimate(c, system)
        below = below_grid(c.loc[system])
        notes = []
        if kind == ">":
            text = (f"{label} passes none of the rates tried (from {below:.3g} req/s), so "
                    f"vLLM / {label} > {fmt(ratio)}×")  # fmt: skip
        elif kind == "?":
            text = f"vLLM / {label}: not bounded"
            notes.append(why_bound(c, system))
        else:
            text = f"vLLM / {label} {kind} {fmt(ratio)}×"
            notes += [] if kind == "=" else [why_bound(c, system)]
        lo, hi = FIG12_SHAREGPT_RATIO.get(system, (None, None))
        if panel.workload == "sharegpt" and hi is not None:
            verdict = (_exact_verdict(c, system, ratio, lo, hi) if kind == "="
                       else _bound_verdict(ratio_bounds(c, system), lo or 1.0, hi))  # fmt: skip
            notes.append(f"paper {_paper_ratio(panel, system)}: {verdict}")
        parts.append(text + (f" ({'; '.join(notes)})" if notes else ""))
    return f"Gap ({panel.letter}): " + "; ".join(parts) + "."


def _vllm_part(panel: Panel, v: Any) -> str:
    """vLLM's rate against the paper's axis, as a bound where it is one."""
    rate, below, axis = float(v["max_rate"]), below_grid(v), f"the paper's axis (0–{panel.axis:g})"
    if below:
        where = f", inside {axis}" if below <= panel.axis else ""
        return f"vLLM passes none of the rates tried, so it sustains < {below:.3g} req/s{where}"
    if passed_all(v):
        where = f", beyond {axis}" if rate > panel.axis else ""
        return f"vLLM passes every rate tried, so it sustains ≥ {rate:.3g} req/s{where}"
    where = "inside" if rate <= panel.axis else "beyond"
    return f"vLLM sustains {rate:.3g} req/s, {where} {axis}"


def _exact_verdict(c: pd.DataFrame, system: str, ratio: float, lo: float | None,
                   hi: float) -> str:  # fmt: skip
    """Inside or outside the paper's [lo, hi] (``lo`` None, "up to": vLLM at least as fast,
    1) by the point ratio, unless the search's resolution (:func:`resolution_bracket`)
    straddles a bound: then "not decided", whatever side the point ratio lies on."""
    lo_ = lo or 1.0
    bracket = resolution_bracket(c, system)
    if bracket and any(bracket[0] < b < bracket[1] for b in (lo_, hi)):
        low, high = (fmt(x) for x in bracket)
        return (f"not decided: the search's resolution puts the ratio in [{low}, {high}], "
                "across the paper's bound")  # fmt: skip
    off = (ratio - hi) if ratio > hi else (ratio - lo_)
    return "inside" if lo_ <= ratio <= hi else f"outside by {off:+.2f}×"


def _bound_verdict(bracket: tuple[float, float] | None, lo: float, hi: float) -> str:
    """The verdict for a ratio that is only a bound: decided only when every value in
    ``bracket`` (:func:`ratio_bounds`; its ends excluded) lies inside [lo, hi] or on one
    side of it, so an end that equals a bound of the range decides."""
    if bracket is None:
        return "not decided"
    low, high = bracket
    if high == lo:
        return f"outside: below {fmt(high)}×, the range's low end"
    if low == hi:
        return f"outside: above {fmt(low)}×, the range's high end"
    if high < lo:
        return f"outside: at most {fmt(high)}×, below the range by ≥ {lo - high:.2f}×"
    if low > hi:
        return f"outside: at least {fmt(low)}×, above the range by ≥ {low - hi:.2f}×"
    if lo <= low and high <= hi:
        return "inside"
    end = f"{fmt(high)}]" if math.isfinite(high) else "∞)"
    return f"not decided: the rates tried put the ratio in [{fmt(low)}, {end}, across the range"


def resolution_bracket(c: pd.DataFrame, system: str) -> tuple[float, float] | None:
    """Where vLLM / ``system`` can lie given the rates tried: each sustainable rate is at
    least the highest rate that passed and below the lowest that failed, so the ratio is
    above vLLM passed / system failed and below vLLM failed / system passed (both ends
    excluded: an end equal to a bound of the paper's range does not straddle it). None
    when a failing rate is
    missing (the grid's top passed) or nothing passed: :func:`ratio_bounds` covers those."""
    if "vllm" not in c.index or system not in c.index:
        return None
    v, s = c.loc["vllm"], c.loc[system]
    rates = (v["max_rate"], v["first_failing_rate"], s["max_rate"], s["first_failing_rate"])
    if any(r is None or r != r or r <= 0 for r in rates):
        return None
    v_pass, v_fail, s_pass, s_fail = (float(r) for r in rates)
    return v_pass / s_fail, v_fail / s_pass


def _narrowing(cap: pd.DataFrame) -> list[str]:
    """The paper's one Alpaca statement: the gap narrows on OPT-175B (§6.2). Not decided
    where either ratio is only a bound (:func:`ratio_estimate`), or where the searches'
    resolution (:func:`resolution_bracket`) leaves the two ratios' ranges overlapping, as
    the gap lines decide against the paper's ranges; "inverts" likewise only where every
    ratio (f)'s runs allow is below 1."""
    est, brackets = {}, {}
    for letter in ("d", "f"):
        c = cap[cap["panel"] == letter].set_index("system")
        if not {"vllm", "orca_oracle"} <= set(c.index):
            return []
        est[letter] = ratio_estimate(c, "orca_oracle")
        brackets[letter] = resolution_bracket(c, "orca_oracle")
    (kind_d, d), (kind_f, f) = est["d"], est["f"]
    bd, bf = brackets["d"], brackets["f"]
    if kind_d != "=" or kind_f != "=":
        verdict = "is not decided (a rate in it is only a bound)"
    elif bd and bf and bf[1] > bd[0] and bf[0] < bd[1]:  # ends excluded: open ranges
        verdict = (
            f"is not decided: the searches' resolution puts (f) in [{fmt(bf[0])}, "
            f"{fmt(bf[1])}] and (d) in [{fmt(bd[0])}, {fmt(bd[1])}], which overlap"
        )
    else:
        verdict = "narrows" if f < d else "does not narrow"
        if (bf[1] if bf else f) < 1:
            verdict += ", and inverts: Orca (Oracle) sustains more than vLLM on (f)"
    shown = {k: ("" if kind == "=" else f"{kind} ") + fmt(x) for k, (kind, x) in est.items()}
    return [f"Alpaca, OPT-175B (f) against OPT-13B (d): vLLM / Orca (Oracle) is {shown['f']}× "
            f"vs {shown['d']}×; kvlab's gap {verdict} (the paper: it narrows, §6.2).",
            ""]  # fmt: skip


@plain_cli
def main(argv: Sequence[str] | None = None) -> str:
    """Print (and return) the report's Fig. 12 section rebuilt from the per-run CSVs in a
    finished run's directory (and its ``fig12_step_mix.csv``, if any:
    :func:`experiments.report.fig12_mix.read_mix`), without running a simulation;
    ``--write-capacity`` also rewrites that directory's ``fig12_capacity.csv`` with
    :func:`capacity`'s columns (its ``threshold`` column from ``--threshold``),
    ``--write-figures`` its figures (:func:`draw`) and ``fig12_curves.csv``."""
    parser = OneLineParser(prog="python -m experiments.report.fig12_rates")
    parser.add_argument("directory", type=Path, help="a run's output (fig12<panel>_*.csv)")
    parser.add_argument("--threshold", type=float, default=1.0,
                        help="the --threshold the runs were made with (s/token)")  # fmt: skip
    parser.add_argument("--write-capacity", action="store_true")
    parser.add_argument("--write-figures", action="store_true")
    args = parser.parse_args(argv)
    if not (math.isfinite(args.threshold) and args.threshold > 0):
        raise ConfigError("--threshold", "not a number > 0", args.threshold)
    rows = read_runs(args.directory)
    cap = capacity(rows, args.threshold)
    if args.write_capacity:
        write_csv(args.directory / "fig12_capacity.csv", cap)
    if args.write_figures:
        from experiments.report.figures import pyplot

        curves = panel_curves(rows)
        write_csv(args.directory / "fig12_curves.csv", curves)
        draw(cap, curves, args.directory, pyplot(headless=True), args.threshold)
    mix = read_mix(args.directory / MIX_FILE)
    text = section(cap, pd.DataFrame(rows), args.threshold, mix=mix)
    print(text, end="")
    return text


if __name__ == "__main__":
    main()
