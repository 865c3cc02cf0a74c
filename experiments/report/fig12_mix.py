"""Why vLLM / Orca (Oracle) moves between Fig. 12's Alpaca panels, computed: memory and
the iteration rule, the two things that set the ratio there.

- Memory (from the rate searches' own runs, no new run): at each system's sustainable
  rate, the mean over seeds of its batch, its preemptions and the share of its KV free
  while requests wait on a scheduler limit (``kv_free_at_limit_pct``: ``max_num_seqs``,
  the token budget; ``core.metrics.summary``). Near zero, memory sets the rate and vLLM's
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

MIX_PANELS = ("d", "f")
MIX_SYSTEMS = ("vllm", "orca_oracle")
MEMORY_COLUMNS = ("mean_batch_size", "num_preemptions", "kv_free_at_limit_pct", "kv_free_pct")
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
    ``steps.csv`` and its mean TPOT from ``metrics``."""
    steps = pd.read_csv(run_dir / "steps.csv",
                        usecols=["prefill_seqs", "decode_seqs", "duration_s"])  # fmt: skip
    return {"panel": run.letter, "system": run.system, "rate": run.rate, "seed": run.seed,
            "trace_s": run.trace_s, **step_mix(steps),
            "mean_tpot_ms": float(metrics["mean_tpot_ms"])}  # fmt: skip


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
    ``letter`` at its sustainable rate; empty when it has none or ``runs`` lacks a column
    (a CSV written before them)."""
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
        "batch": float(at["mean_batch_size"].mean()),
        "preemptions": float(at["num_preemptions"].mean()),
        "free_at_limit": float(at["kv_free_at_limit_pct"].mean()),
        "free": float(at["kv_free_at_limit_pct"].mean() + at["kv_free_pct"].mean()),
    }


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
            f"- ({letter}) memory, at the sustainable rates ({v['rate']:g} and {o['rate']:g} "
            f"req/s, mean over seeds): vLLM batches {v['batch']:.0f} requests against Orca "
            f"(Oracle)'s {o['batch']:.0f}, with {v['free']:.1f}% of its KV free "
            f"({v['free_at_limit']:.1f}% while requests wait on a scheduler limit; Orca "
            f"(Oracle): {o['free']:.1f}% and {o['free_at_limit']:.1f}%) and "
            f"{v['preemptions']:,.0f} preemptions"
        ]
        m = _mix_of(mix, letter)
        if m is not None:
            mv, mo = m["vllm"], m["orca_oracle"]
            parts.append(
                f"steps, one run each at {mv['rate']:g} req/s (seed {int(mv['seed'])}, "
                f"{mv['trace_s']:g}-s trace): {mv['prompt_only_steps']:,} of vLLM's "
                f"{mv['steps']:,} steps are prompt-only ({mv['prompt_only_busy_pct']:.0f}% of "
                f"its busy time), against {mo['prompt_only_steps']:,} of Orca (Oracle)'s "
                f"{mo['steps']:,}, whose prompts ride in {mo['mixed_steps']:,} decode steps; "
                f"a decode-only step takes {mv['decode_only_step_ms']:.1f} ms against "
                f"{mo['decode_only_step_ms']:.1f}, and mean TPOT is {mv['mean_tpot_ms']:.1f} "
                f"against {mo['mean_tpot_ms']:.1f} ms"
            )
        out.append("; ".join(parts) + ".")
    if not out:
        return []
    head = (
        "Why the Alpaca ratio moves (computed; where vLLM's KV is near full at its rate, "
        "memory sets the rate and its smaller waste wins it more requests; where much of "
        "it is free, memory is not what stops it; a prompt-only step advances no decode, "
        "so each of vLLM's prompts costs its running requests a step, while Orca runs its "
        "prompts inside decode steps; `experiments/report/fig12_mix.py`, "
        "`fig12_step_mix.csv`):"
    )
    return [head, "", *out, ""]


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
