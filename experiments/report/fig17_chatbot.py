"""Fig. 17: chatbot, OPT-13B on one A100-40GB: conversations whose prompt is the history
truncated to its last 1024 tokens, replies of at most 1024 tokens, no KV kept between
rounds (``configs/workload/multi_turn.yaml``): the request rate vLLM sustains against the
three Orca variants.

The paper (§6.5): vLLM sustains 2x the request rate of the three Orca baselines. Choices
where the paper is silent (config values here): 4 rounds per conversation, 10 s think time
(``multi_turn.yaml``), conversations sized so the trace lasts about ``duration_s``, the
rate grid and the trace length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.report.figures import SYSTEM_COLORS, pyplot, save
from experiments.report.paper import SYSTEM_LABELS
from experiments.report.rate_search import Search, capacity_table

SYSTEMS = ("orca_max", "orca_pow2", "orca_oracle", "vllm")
RATES = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0)
ROUNDS = 4
PAPER_RATIO = 2.0  # §6.5, vLLM / each Orca variant


def conversation_overrides(duration_s: float, rate: float) -> list[str]:
    """A trace of about ``duration_s`` at ``rate`` requests/s: conversations start at
    rate / rounds per second, so rate * duration / rounds of them."""
    conversations = max(1, math.ceil(rate * duration_s / ROUNDS))
    return [f"workload.rate={rate}", f"workload.num_conversations={conversations}"]


def searches(duration_s: float, seed: int) -> list[Search]:
    base = ("model=opt-13b", "hardware=a100-40gb", "workload=multi_turn",
            f"workload.rounds={ROUNDS}", f"seed={seed}")  # fmt: skip
    per_rate = partial(conversation_overrides, duration_s)
    return [
        Search("fig17", "chatbot", system, (*base, f"system={system}"), RATES, per_rate)
        for system in SYSTEMS
    ]


def draw_fig17(runs: pd.DataFrame) -> Any:
    """Fig. 17: normalized latency against request rate, one line per system.
    ``runs``: every run of the searches (``fig17_chatbot.csv``)."""
    fig, ax = pyplot().subplots(figsize=(4.8, 3.2))
    for system in SYSTEMS:
        label, color = SYSTEM_LABELS[system], SYSTEM_COLORS[system]
        df = runs[runs["system"] == system].sort_values("rate")
        ax.plot(df["rate"], df["normalized_latency"], marker="o", ms=3, label=label, color=color)
    ax.set_xlabel("Request rate (req/s)")
    ax.set_ylabel("Normalized latency (s/token)")
    ax.set_ylim(0, 2.0)
    ax.set_title("Fig. 17: chatbot, OPT-13B (simulated)", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def write(rows: Sequence[dict[str, Any]], out: Path, plt: Any) -> str:
    """fig17_chatbot.csv (every run), fig17_capacity.csv, .png/.pdf; the report section."""
    runs = pd.DataFrame(rows)
    runs.to_csv(out / "fig17_chatbot.csv", index=False)
    cap = pd.DataFrame(capacity_table(rows, "vllm"))
    cap.to_csv(out / "fig17_capacity.csv", index=False)
    fig = draw_fig17(runs)
    save(fig, out, "fig17_chatbot")
    plt.close(fig)
    lines = [
        "## Fig. 17: chatbot (OPT-13B, history truncated to 1024 tokens)",
        "",
        "| system | sustained req/s | vLLM ÷ system | paper | gap |",
        "|---|---|---|---|---|",
    ]
    for system in SYSTEMS:
        r = cap[cap["system"] == system].iloc[0]
        paper = "—" if system == "vllm" else f"{PAPER_RATIO:.1f}×"
        gap = "—" if system == "vllm" else f"{r['vllm_ratio'] - PAPER_RATIO:+.2f}×"
        name = SYSTEM_LABELS[system]
        lines.append(f"| {name} | {r['max_rate']:.2f} | {r['vllm_ratio']:.2f}× | {paper} | {gap} |")
    return "\n".join(lines) + "\n"
