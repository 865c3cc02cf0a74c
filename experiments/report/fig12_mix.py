"""Why vLLM / Orca (Oracle) moves between Fig. 12's Alpaca panels, computed: memory and
the iteration rule, the two things that set the ratio there.

- Memory (from the rate searches' own runs, no new run): at each system's sustainable
  rate, the mean over seeds of its batch, its preemptions and the share of its KV free
  while requests wait on a scheduler limit (``kv_free_at_limit_pct``: ``max_num_seqs``,
  the token budget; ``core.metrics.summary``), split by the limit where the runs' CSV has
  the split (``kv_free_at_<limit>_pct``). Near zero, memory sets the rate and vLLM's
  smaller waste wins it requests; far from zero, memory is not what stops either system.
- The iteration rule (:func:`mix_runs`, one run per system and panel): vLLM v0.1 runs each
  admitted prompt in a prompt-only step that advances no decode; Orca runs prompts inside
  decode steps (selective batching). Each run keeps its ``steps.csv``, and
  :func:`step_mix` counts the kinds of step, the mean decode-only step and the share of
  busy time in prompt-only steps.

The mix runs' inputs were chosen before any result: half the paper's x-axis (the middle of
the rates the paper shows), the first seed, the panel's trace. Only the Alpaca panels
(:data:`MIX_PANELS`) get them: the paper's one Alpaca statement (the gap narrows on
OPT-175B, §6.2) is where the two causes part.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from core.metrics.summary import FREE_AT_LIMIT_KEYS
from core.plan import HELD_BY_KEY, QUEUE_HELD_BY
from experiments.lib.checks import ConfigError
from experiments.report.bound_text import fmt

MIX_PANELS = ("d", "f")
MIX_SYSTEMS = ("vllm", "orca_oracle")
MEMORY_COLUMNS = ("mean_batch_size", "num_preemptions", "kv_free_at_limit_pct", "kv_free_pct")
# ``kv_free_at_limit_pct`` by limit: optional (a CSV written before them has none)
LIMIT_COLUMNS = dict(zip(FREE_AT_LIMIT_KEYS, (QUEUE_HELD_BY[c] for c in HELD_BY_KEY), strict=True))
MIX_COLUMNS = (
    "panel", "system", "rate", "seed", "trace_s", "steps", "prompt_only_steps",
    "mixed_steps", "decode_only_steps", "decode_only_step_ms", "prompt_only_busy_pct",
    "mean_tpot_ms",
)  # fmt: skip


@dataclass(frozen=True)
class MixRun:
    """One mix run: ``system`` on panel ``letter`` at ``rate`` req/s, ``seed``, a
    ``trace_s``-second trace; ``overrides`` are the simulate config's (clock not included)."""

    letter: str
    system: str
    rate: float
    seed: int
    trace_s: float
    overrides: tuple[str, ...]

    @property
    def label(self) -> str:
        """The run's name (its directory under ``runs/``)."""
        return f"fig12_{self.letter}_steps_{self.system}"


def mix_runs(panels: Sequence[Any], trace_of: Callable[[Any], float], seed: int) -> list[MixRun]:
    """The mix runs of the :data:`MIX_PANELS` among ``panels`` (``fig12_rates.Panel``):
    each of :data:`MIX_SYSTEMS` at half the paper's x-axis, ``seed``, on ``trace_of(panel)``
    seconds of the panel's workload."""
    out = []
    for p in [p for p in panels if p.letter in MIX_PANELS]:
        rate, t = p.axis / 2, trace_of(p)
        for system in MIX_SYSTEMS:
            overrides = (f"model={p.model}", f"hardware={p.hardware}", f"workload={p.workload}",
                         f"workload.duration_s={t}", f"workload.rate={rate:g}", f"seed={seed}",
                         f"system={system}")  # fmt: skip
            out.append(MixRun(p.letter, system, rate, seed, t, overrides))
    return out


def mix_row(run: MixRun, run_dir: Path, metrics: dict[str, Any]) -> dict[str, Any]:
    """``run``'s row of ``fig12_step_mix.csv``: its :func:`step_mix` from ``run_dir``'s
    ``steps.csv`` and its mean TPOT from ``metrics`` (NaN where it is None: a finished run
    read back from its ``metrics.json``, which writes NaN as null)."""
    steps = pd.read_csv(run_dir / "steps.csv",
                        usecols=["prefill_seqs", "decode_seqs", "duration_s"])  # fmt: skip
    tpot = metrics.get("mean_tpot_ms")
    return {"panel": run.letter, "system": run.system, "rate": run.rate, "seed": run.seed,
            "trace_s": run.trace_s, **step_mix(steps),
            "mean_tpot_ms": math.nan if tpot is None else float(tpot)}  # fmt: skip


def step_mix(steps: pd.DataFrame) -> dict[str, float]:
    """Counts of a run's steps by kind (``steps.csv``'s rows): prompt-only (prefill and no
    decode), mixed (both), decode-only; the mean decode-only step in ms (NaN without one)
    and the percent of the steps' summed duration spent in prompt-only steps (NaN when it
    is zero)."""
    prefill, decode = steps["prefill_seqs"] > 0, steps["decode_seqs"] > 0
    duration = steps["duration_s"]
    busy = float(duration.sum())
    decode_only = decode & ~prefill
    return {
        "steps": len(steps),
        "prompt_only_steps": int((prefill & ~decode).sum()),
        "mixed_steps": int((prefill & decode).sum()),
        "decode_only_steps": int(decode_only.sum()),
        "decode_only_step_ms": float(duration[decode_only].mean()) * 1e3
        if decode_only.any() else math.nan,
        "prompt_only_busy_pct": 100 * float(duration[prefill & ~decode].sum()) / busy
        if busy > 0 else math.nan,
    }  # fmt: skip


def memory_at_rate(runs: pd.DataFrame, cap: pd.DataFrame, letter: str, system: str) -> dict:
    """Mean over seeds of batch, preemptions, ``kv_free_at_limit_pct`` and all free KV
    (that and ``kv_free_pct``: free with nobody waiting) of ``system``'s runs on panel
    ``letter`` at its sustainable rate; ``by_limit``: ``kv_free_at_limit_pct`` by the
    limit's name (:func:`_split`: empty unless every run at the rate records the split);
    and ``open``: that rate is only a lower bound (``cap``'s ``rate_open``: every rate
    tried passed); empty when it has none or ``runs`` lacks a column of
    :data:`MEMORY_COLUMNS` (a CSV written before them)."""
    if not set(MEMORY_COLUMNS) <= set(runs.columns):
        return {}
    c = cap[(cap["panel"] == letter) & (cap["system"] == system)]
    if c.empty or not c["max_rate"].iloc[0] > 0:
        return {}
    rate = c["max_rate"].iloc[0]
    at = runs[(runs["setting"] == letter) & (runs["system"] == system) & (runs["rate"] == rate)]
    if at.empty:
        return {}
    return {
        "rate": float(rate),
        "open": "rate_open" in c.columns and str(c["rate_open"].iloc[0]) == "True",
        "batch": float(at["mean_batch_size"].mean()),
        "preemptions": float(at["num_preemptions"].mean()),
        "free_at_limit": float(at["kv_free_at_limit_pct"].mean()),
        "free": float(at["kv_free_at_limit_pct"].mean() + at["kv_free_pct"].mean()),
        "by_limit": _split(at),
    }


def _split(at: pd.DataFrame) -> dict[str, float]:
    """Mean over ``at``'s runs of each :data:`LIMIT_COLUMNS` column, by the limit's name;
    empty unless every run records every one it has (a run of older code, resumed, has
    none, and a mean over the other runs would not split the mean total)."""
    cols = [col for col in LIMIT_COLUMNS if col in at]
    if not cols:
        return {}
    values = at[cols].apply(pd.to_numeric, errors="coerce")
    if values.isna().to_numpy().any():
        return {}
    return {LIMIT_COLUMNS[col]: float(values[col].mean()) for col in cols}


def lines(runs: pd.DataFrame, cap: pd.DataFrame, mix: pd.DataFrame | None) -> list[str]:
    """The report's computed lines under Fig. 12's Alpaca narrowing line: per panel of
    :data:`MIX_PANELS` in ``cap``, vLLM's and Orca (Oracle)'s memory at their sustainable
    rates (:func:`memory_at_rate`) and, where ``mix`` (:data:`MIX_COLUMNS` rows) has the
    panel, their step mix. Empty when no such panel has both systems."""
    out = []
    for letter in [x for x in MIX_PANELS if x in set(cap["panel"])]:
        mem = {s: memory_at_rate(runs, cap, letter, s) for s in MIX_SYSTEMS}
        if not all(mem.values()):
            continue
        v, o = mem["vllm"], mem["orca_oracle"]
        parts = [
            f"- ({letter}) memory, at the sustainable rates ({_rate(v)} and {_rate(o)} "
            f"req/s, mean over seeds): vLLM batches {fmt(v['batch'], '.0f')} requests against "
            f"Orca (Oracle)'s {fmt(o['batch'], '.0f')}, with {fmt(v['free'], '.1f')}% of its KV "
            f"free ({fmt(v['free_at_limit'], '.1f')}% while requests wait on a scheduler "
            f"limit{_by_limit(v)}; Orca (Oracle): {fmt(o['free'], '.1f')}% and "
            f"{fmt(o['free_at_limit'], '.1f')}%{_by_limit(o)}) and {fmt(v['preemptions'], ',.0f')} "
            "preemptions"
        ]
        m = _mix_of(mix, letter)
        if m is not None:
            parts.append(_steps_text(m["vllm"], m["orca_oracle"]))
        out.append("; ".join(parts) + ".")
    if not out:
        return []
    head = (
        "Why the Alpaca ratio moves (computed; where vLLM's KV is near full at its rate, "
        "memory sets the rate and its smaller waste wins it more requests; where much of "
        "it is free, memory is not what stops it (free while requests wait on a scheduler "
        "limit: max_num_seqs or the token budget holds it, named with its share where the "
        "runs record which; free memory that requests wait for counts as external "
        "fragmentation, not here); a prompt-only step advances no "
        "decode, so each of vLLM's prompts costs its running requests a step, while Orca "
        "runs its prompts inside decode steps: the step mix is from one run per system at "
        "half the paper's axis, a fixed rate, not the sustainable ones; "
        "`experiments/report/fig12_mix.py`, `fig12_step_mix.csv`):"
    )
    return [head, "", *out, ""]


def _rate(mem: dict[str, Any]) -> str:
    """A :func:`memory_at_rate` rate, "≥" before one that is only a lower bound."""
    return f"{'≥ ' if mem['open'] else ''}{mem['rate']:g}"


def _by_limit(mem: dict[str, Any]) -> str:
    """The limits holding a :func:`memory_at_rate` row's free KV, as " (<limit> x%, ...)",
    the largest first, those that print as 0.0 left out; "" when none does (or no split)."""
    shown = sorted(
        ((pct, name) for name, pct in mem.get("by_limit", {}).items() if pct >= 0.05),
        key=lambda x: -x[0],
    )
    if not shown:
        return ""
    return " (" + ", ".join(f"{name} {pct:.1f}%" for pct, name in shown) + ")"


def _steps_text(mv: dict[str, Any], mo: dict[str, Any]) -> str:
    """The step-mix part of a panel's line: vLLM's row ``mv`` against Orca (Oracle)'s
    ``mo``; a run without a step is named as such, a number that is NaN printed "—"."""
    head = (f"steps, one run each at {mv['rate']:g} req/s (seed {int(mv['seed'])}, "
            f"{mv['trace_s']:g}-s trace)")  # fmt: skip
    idle = [name for name, r in (("vLLM", mv), ("Orca (Oracle)", mo)) if not r["steps"] > 0]
    if len(idle) == 2:
        return f"{head}: neither system ran a step"
    if idle:
        return f"{head}: {idle[0]} ran no step"
    return (
        f"{head}: {mv['prompt_only_steps']:,} of vLLM's {mv['steps']:,} steps are prompt-only "
        f"({fmt(mv['prompt_only_busy_pct'], '.0f')}% of its busy time), against "
        f"{mo['prompt_only_steps']:,} of Orca (Oracle)'s {mo['steps']:,}, whose prompts ride "
        f"in {mo['mixed_steps']:,} decode steps; a decode-only step takes "
        f"{fmt(mv['decode_only_step_ms'], '.1f')} ms against "
        f"{fmt(mo['decode_only_step_ms'], '.1f')}, and mean TPOT is "
        f"{fmt(mv['mean_tpot_ms'], '.1f')} against {fmt(mo['mean_tpot_ms'], '.1f')} ms"
    )


def _mix_of(mix: pd.DataFrame | None, letter: str) -> dict[str, dict[str, Any]] | None:
    if mix is None or mix.empty:
        return None
    rows = mix[mix["panel"] == letter].set_index("system")
    if not set(MIX_SYSTEMS) <= set(rows.index):
        return None
    return {s: rows.loc[s].to_dict() for s in MIX_SYSTEMS}


def mix_table(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """``fig12_step_mix.csv``: ``rows`` in :data:`MIX_COLUMNS`, by panel and system."""
    frame = pd.DataFrame(list(rows), columns=list(MIX_COLUMNS))
    return frame.sort_values(["panel", "system"], kind="stable").reset_index(drop=True)


def read_fig12_csv(path: Path, columns: Sequence[str], rows: str) -> pd.DataFrame:
    """A CSV a Fig. 12 run of ``experiments.reproduce`` wrote; a ConfigError naming ``path``
    when it is empty, not CSV or lacks one of ``columns`` (``rows``: what its rows are, for
    the message)."""
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ConfigError(str(path), f"empty: no {rows} rows") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), f"not a {rows} CSV ({str(exc).splitlines()[0]})") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        expected = "the CSV a Fig. 12 run of experiments.reproduce writes"
        raise ConfigError(str(path), "missing column(s) " + ", ".join(missing), expected=expected)
    return frame


def read_mix(path: Path) -> pd.DataFrame | None:
    """``fig12_step_mix.csv`` at ``path`` (:data:`MIX_COLUMNS`), None where there is none.
    A ConfigError naming ``path`` when it is empty, not CSV, lacks a column or holds a
    panel's system twice."""
    if not path.is_file():
        return None
    frame = read_fig12_csv(path, MIX_COLUMNS, "step-mix")
    frame["panel"] = frame["panel"].astype(str)
    twice = frame.index[frame.duplicated(["panel", "system"])]
    for row in twice[:1]:
        raise ConfigError(str(path), f"line {row + 2}: panel {frame.loc[row, 'panel']}, "
                          f"system {frame.loc[row, 'system']} a second time")  # fmt: skip
    return frame
