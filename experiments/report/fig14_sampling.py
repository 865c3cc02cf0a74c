"""Fig. 14: parallel sampling (n = 2, 4, 6) and beam search (width 2, 4, 6), OPT-13B on one
A100-40GB, Alpaca-like requests: the request rate vLLM sustains against Orca (Oracle).

The paper (§6.3) prints one number for this figure: vLLM's improvement over Orca (Oracle)
"goes from 1.3x in basic sampling to 2.3x in beam search with a width of 6"; kvlab's
width-6 ratio stands beside the 2.3x (basic sampling is Fig. 12's Alpaca panel, not run
here). Choices where the paper is silent (config values of :func:`searches`): the rate grid,
the normalized-latency threshold (``reproduce --threshold``) and the trace length. The
simulator's beams follow top-``width`` selection on seeded scores (``sim/beams.py``).

Bounds (shared by the Fig. 14, 16 and 17 sections: :mod:`experiments.report.bound_text`): a
system that passed every rate tried has only a lower bound on its rate
(printed "≥"), one that passed none only an upper bound (the lowest rate tried, "<"); a ratio
with such a rate in it is a bound (``bound_text.ratio_estimate``: "≥", "≤", ">", "<"), and
its gap to the paper is a number only where every ratio the rates tried allow
(``bound_text.ratio_bounds``) lies on one side of the paper's value, else "not decided".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.lib.results import write_csv
from experiments.report.bound_text import (
    BOUNDS_NOTE,
    NOT_DECIDED,
    gap_text,
    has_bounds,
    rate_text,
    ratio_cell,
    ratio_estimate,
    ratio_text,
    why_bound,
)
from experiments.report.figures import (
    BAR_MARKS,
    SYSTEM_COLORS,
    pyplot,
    rate_bars,
    save,
)
from experiments.report.paper import SYSTEM_LABELS
from experiments.report.rate_search import Search, capacity_table
from experiments.report.tables import markdown_rows

SETTINGS = (("n", 2), ("n", 4), ("n", 6), ("beam", 2), ("beam", 4), ("beam", 6))
SYSTEMS = ("orca_oracle", "vllm")
RATES = (2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)
PAPER_RATIO = {"beam 6": 2.3}  # §6.3: vLLM / Orca (Oracle); "1.3x in basic sampling"


def searches(duration_s: float, seed: int, seeds: int = 1) -> list[Search]:
    """One search per setting and system; every rate runs on ``seeds`` seeds from ``seed``."""
    base = ("model=opt-13b", "hardware=a100-40gb", "workload=alpaca",
            f"workload.duration_s={duration_s}")  # fmt: skip
    seed_list = tuple(range(seed, seed + max(1, seeds)))
    out = []
    for kind, k in SETTINGS:
        key = "workload.n" if kind == "n" else "workload.beam_width"
        for system in SYSTEMS:
            out.append(Search("fig14", f"{kind} {k}", system,
                              (*base, f"system={system}", f"{key}={k}"), RATES,
                              seeds=seed_list))  # fmt: skip
    return out


def draw_fig14(cap: pd.DataFrame) -> Any:
    """Fig. 14: the sustained rate of each system per setting (bar) with its interval over
    seeds (error bar), parallel sampling and beam search side by side. ``cap``:
    :func:`capacity_table` rows (``fig14_capacity.csv``)."""
    fig, axes = pyplot().subplots(1, 2, figsize=(8, 3.2), sharey=False)
    for ax, kind in zip(axes, ("n", "beam"), strict=True):
        sub = cap[cap["setting"].str.startswith(kind + " ")]
        ks = [int(s.split()[1]) for s in sub["setting"].unique()]
        width = 0.38
        for j, system in enumerate(SYSTEMS):
            label, color = SYSTEM_LABELS[system], SYSTEM_COLORS[system]
            rows = [sub[(sub["setting"] == f"{kind} {k}") & (sub["system"] == system)].iloc[0]
                    for k in ks]  # fmt: skip
            xs = [i + (j - 0.5) * width for i in range(len(ks))]
            rate_bars(ax, xs, rows, width, label=label, color=color)
        ax.set_xticks(range(len(ks)), [f"{'n' if kind == 'n' else 'width'}={k}" for k in ks])
        ax.set_title("parallel sampling" if kind == "n" else "beam search", fontsize=9)
        ax.set_ylabel("sustained rate (req/s)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Fig. 14: OPT-13B, Alpaca (simulated)\n{BAR_MARKS}", fontsize=8)
    return fig


def write(rows: Sequence[dict[str, Any]], out: Path, plt: Any) -> str:
    """fig14_sampling.csv (every run), fig14_capacity.csv, fig14_sampling.png/.pdf; returns
    the report section."""
    runs = pd.DataFrame(rows)
    write_csv(out / "fig14_sampling.csv", runs)
    cap = pd.DataFrame(capacity_table(rows, "orca_oracle"))
    write_csv(out / "fig14_capacity.csv", cap)
    fig = draw_fig14(cap)
    save(fig, out, "fig14_sampling")
    plt.close(fig)
    lines = [
        "## Fig. 14: parallel sampling and beam search (OPT-13B, Alpaca)",
        "",
        "Sustained request rate (normalized latency under the threshold on every seed) of "
        f"vLLM and Orca (Oracle), on {_seeds(runs)} seed(s) per rate; [interval]: the min–max "
        "over seeds of each seed's own sustained rate (`experiments.report.rate_search`). "
        "The paper prints only the beam-width-6 ratio.",
        "",
        *markdown_rows(ratio_table(cap)),
    ]
    c6 = cap[cap["setting"] == "beam 6"].set_index("system")
    if {"vllm", "orca_oracle"} <= set(c6.index):
        lines += ["", _gap_w6(c6)]
    if has_bounds(cap):
        lines += ["", BOUNDS_NOTE]
    return "\n".join(lines) + "\n"


def ratio_table(cap: pd.DataFrame) -> pd.DataFrame:
    """The report's table: per setting of ``cap`` (:func:`capacity_table` rows, both
    :data:`SYSTEMS` for each setting), in its order, the text cells of each system's rate
    with its seed interval, vLLM ÷ Orca (Oracle) with its interval, and the paper's ratio;
    rates and ratios that are only bounds marked (``bound_text.rate_text``,
    ``bound_text.ratio_cell``)."""
    rows = {}
    for setting in cap["setting"].unique():
        c = cap[cap["setting"] == setting].set_index("system")
        paper = PAPER_RATIO.get(setting)
        rows[setting] = [rate_text(c.loc["orca_oracle"], interval=True),
                         rate_text(c.loc["vllm"], interval=True), ratio_cell(c, "orca_oracle"),
                         f"{paper:.1f}×" if paper else "—"]  # fmt: skip
    columns = ["Orca (Oracle) req/s [interval]", "vLLM req/s [interval]",
               "vLLM ÷ Orca (Oracle) [interval]", "paper"]  # fmt: skip
    return pd.DataFrame.from_dict(rows, orient="index", columns=columns).rename_axis("setting")


def _seeds(runs: pd.DataFrame) -> int:
    return int(runs["seed"].nunique()) if "seed" in runs and runs["seed"].notna().any() else 1


def _gap_w6(c: pd.DataFrame) -> str:
    """The beam-width-6 gap line: kvlab's ratio minus the paper's, a bound or "not decided"
    where the ratio is only a bound (:func:`gap_text`). ``c``: the setting's capacity rows
    indexed by system."""
    kind, _ = ratio_estimate(c, "orca_oracle")
    gap = gap_text(c, "orca_oracle", PAPER_RATIO["beam 6"])
    if kind == "=":
        return f"Gap at beam width 6: kvlab − paper = {gap} (ratio points)."
    why = f"vLLM ÷ Orca (Oracle) is {ratio_text(c, 'orca_oracle')}: {why_bound(c, 'orca_oracle')}"
    if gap == NOT_DECIDED:
        return f"Gap at beam width 6: {NOT_DECIDED} ({why})."
    return f"Gap at beam width 6: kvlab − paper {gap} (ratio points; {why})."
