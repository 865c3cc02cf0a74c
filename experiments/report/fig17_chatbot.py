"""Fig. 17: chatbot, OPT-13B on one A100-40GB: conversations whose prompt is the history
truncated to its last 1024 tokens, replies of at most 1024 tokens, no KV kept between
rounds (``configs/workload/multi_turn.yaml``): the request rate vLLM sustains against the
three Orca variants.

The paper (§6.5): vLLM sustains 2x the request rate of the three Orca baselines. Choices
where the paper is silent (config values here): 4 rounds per conversation, 10 s think time
(``multi_turn.yaml``), conversations sized so the trace lasts about ``duration_s``, the
rate grid and the trace length. The report section states them (:func:`setup_line`, read
from the config the runs compose) and marks rates and ratios that are only bounds
(:mod:`experiments.report.bound_text`).

The rate searched and printed is the nominal one (``workload.rate``): conversations start at
rate / rounds per second for ``duration_s``, but round ``r`` arrives ``r * think_time_s``
after its start, so arrivals span about duration_s + (rounds - 1) * think_time_s and a short
trace's actual mean arrival rate is lower (30 s: about half). Both systems' traces share the
factor, so ratios are unaffected; the section prints the actual rate at each sustained rate
(:func:`arrival_rate`, rebuilt from the run's config, seed and trace length, which each run
row carries).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from core.workload.spec import build_workload
from experiments.lib.compose import compose_config
from experiments.lib.results import write_csv
from experiments.report.bound_text import (
    BOUNDS_NOTE,
    gap_text,
    has_bounds,
    rate_text,
    ratio_text,
)
from experiments.report.figures import pyplot, save, system_style
from experiments.report.paper import SYSTEM_LABELS
from experiments.report.rate_search import Search, capacity_table

SYSTEMS = ("orca_max", "orca_pow2", "orca_oracle", "vllm")
RATES = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0)
ROUNDS = 4
PAPER_RATIO = 2.0  # §6.5, vLLM / each Orca variant
# the config of every run, less its system, rate, trace size and seed
BASE = ("model=opt-13b", "hardware=a100-40gb", "workload=multi_turn", f"workload.rounds={ROUNDS}")


def conversation_overrides(duration_s: float, rate: float) -> list[str]:
    """The overrides of a run at nominal ``rate`` requests/s: conversations start at
    rate / rounds per second, rate * duration_s / rounds of them (starts over about
    ``duration_s``; their later rounds arrive after it: :func:`arrival_rate`)."""
    conversations = max(1, math.ceil(rate * duration_s / ROUNDS))
    return [f"workload.rate={rate}", f"workload.num_conversations={conversations}"]


def searches(duration_s: float, seed: int) -> list[Search]:
    """One search per system on the nominal rate grid; each run row carries its ``seed``
    and ``trace_s`` (``duration_s``), so :func:`arrival_rate` can rebuild its trace."""
    per_rate = partial(conversation_overrides, duration_s)
    return [
        Search(
            "fig17",
            "chatbot",
            system,
            (*BASE, f"system={system}"),
            RATES,
            per_rate,
            seeds=(seed,),
            trace_s=duration_s,
        )
        for system in SYSTEMS
    ]


def trace_config(duration_s: float, rate: float, seed: int | None) -> DictConfig:
    """The config of a run at nominal ``rate`` on a ``duration_s`` trace (its system aside,
    which does not change the trace); ``seed`` None: the config's default seed."""
    seeded = [] if seed is None else [f"seed={seed}"]
    return compose_config("simulate", [*BASE, *conversation_overrides(duration_s, rate), *seeded])


def arrival_rate(duration_s: float, rate: float, seed: int | None) -> float:
    """The actual mean arrival rate of the trace a run at nominal ``rate`` used: its requests
    over the time of its last arrival (the trace starts at 0 s), on the trace
    :func:`trace_config` builds. NaN for a rate <= 0 (no rate passed)."""
    if not rate > 0:
        return math.nan
    cfg = trace_config(duration_s, rate, seed)
    workload = OmegaConf.to_container(cfg.workload, resolve=True)
    requests = build_workload(workload, seed=int(cfg.seed))  # type: ignore[arg-type]
    last = max((r.arrival_time for r in requests), default=0.0)
    return len(requests) / last if last > 0 else math.nan


def setup_line() -> str:
    """The section's line on the setup the paper leaves open, read from the config every
    run composes (:data:`BASE`): rounds, think time, the synthetic conversations."""
    w = compose_config("simulate", BASE).workload
    return (
        f"Setup the paper leaves open: {w.rounds} rounds per conversation, {w.think_time_s:g} s "
        "think time between rounds, synthetic conversations (message and reply lengths drawn "
        f"from kvlab's fitted `{w.dataset}` length model, not real conversations), "
        f"conversations starting at rate / {w.rounds} per second (`{w.arrival}` arrivals)."
    )


def rate_note(duration_s: float) -> str:
    """Why the nominal rate is not the trace's mean arrival rate on a ``duration_s`` trace,
    with the shortfall the config's rounds and think time imply."""
    w = compose_config("simulate", BASE).workload
    tail = (w.rounds - 1) * w.think_time_s
    short = tail / (duration_s + tail)
    return (
        f"Rates are nominal (`workload.rate`): conversations start at rate / {w.rounds} per "
        f"second for {duration_s:g} s, but each conversation's {w.rounds} rounds arrive "
        f"{w.think_time_s:g} s apart, so arrivals span about {duration_s:g} + {tail:g} s and "
        "the trace's actual mean arrival rate (last column: requests ÷ time of the last "
        f"arrival) is about {short:.0%} lower on this trace (less on longer traces). "
        "The systems' traces share the factor, so the ratios are unaffected."
    )


def draw_fig17(runs: pd.DataFrame) -> Any:
    """Fig. 17: normalized latency against request rate, one line per system.
    ``runs``: every run of the searches (``fig17_chatbot.csv``)."""
    fig, ax = pyplot().subplots(figsize=(4.8, 3.2))
    for system in SYSTEMS:
        label, style = SYSTEM_LABELS[system], system_style(system)
        df = runs[runs["system"] == system].sort_values("rate")
        ax.plot(df["rate"], df["normalized_latency"], marker="o", ms=3, label=label, **style)
    ax.set_xlabel("Request rate (req/s)")
    ax.set_ylabel("Normalized latency (s/token)")
    ax.set_ylim(0, 2.0)
    ax.set_title("Fig. 17: chatbot, OPT-13B (simulated)", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def write(rows: Sequence[dict[str, Any]], out: Path, plt: Any) -> str:
    """fig17_chatbot.csv (every run), fig17_capacity.csv, .png/.pdf; the report section."""
    runs = pd.DataFrame(rows)
    write_csv(out / "fig17_chatbot.csv", runs)
    cap = pd.DataFrame(capacity_table(rows, "vllm"))
    write_csv(out / "fig17_capacity.csv", cap)
    fig = draw_fig17(runs)
    save(fig, out, "fig17_chatbot")
    plt.close(fig)
    c = cap.set_index("system")
    lines = [
        "## Fig. 17: chatbot (OPT-13B, history truncated to 1024 tokens)",
        "",
        setup_line(),
        "",
        "| system | sustained req/s | vLLM ÷ system | paper | gap | actual mean arrival req/s |",
        "|---|---|---|---|---|---|",
    ]
    for system in SYSTEMS:
        paper = "—" if system == "vllm" else f"{PAPER_RATIO:.1f}×"
        gap = "—" if system == "vllm" else gap_text(c, system, PAPER_RATIO)
        name = SYSTEM_LABELS[system]
        actual = _actual_rate(runs, c.loc[system], system)
        lines.append(
            f"| {name} | {rate_text(c.loc[system])} | {ratio_text(c, system)} "
            f"| {paper} | {gap} | {actual} |"
        )
    trace = runs["trace_s"].dropna() if "trace_s" in runs else pd.Series(dtype=float)
    if len(trace):
        lines += ["", rate_note(float(trace.iloc[0]))]
    if has_bounds(cap):
        lines += ["", BOUNDS_NOTE]
    return "\n".join(lines) + "\n"


def _actual_rate(runs: pd.DataFrame, r: Any, system: str) -> str:
    """The actual-arrival-rate cell of ``system`` at its sustained rate (capacity row
    ``r``): :func:`arrival_rate` from its run row's ``trace_s`` and ``seed``; "—" where no
    rate passed or the rows lack the trace length."""
    at = runs[(runs["system"] == system) & (runs["rate"] == r["max_rate"])]
    if r["max_rate"] <= 0 or not len(at) or "trace_s" not in at or at["trace_s"].isna().all():
        return "—"
    row = at.iloc[0]
    seed = None if row.get("seed") is None or row["seed"] != row["seed"] else int(row["seed"])
    return f"{arrival_rate(float(row['trace_s']), float(r['max_rate']), seed):.2f}"
