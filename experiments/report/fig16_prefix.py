"""Fig. 16: shared prefix (WMT16 En→De translation with few-shot examples), LLaMA-13B:
the request rate vLLM (prefix blocks shared: ``system.enable_prefix_caching=true``)
sustains against Orca (Oracle), with a 1-shot (80-token) and a 5-shot (341-token) prefix.

The paper (§6.4): vLLM reaches 1.67x Orca (Oracle)'s throughput with the 1-shot prefix and
3.58x with the 5-shot prefix. Choices where the paper is silent (config values here): one
A100-40GB (the paper does not name the GPU; LLaMA-13B's weights are OPT-13B's size), the
sentence and translation lengths (``configs/workload/shared_prefix.yaml``: lognormal, mean
30 tokens each, log-space sigma 0.5: ``core.workload.synthetic.shared_prefix``), the rate
grid and the trace length. The report section states the GPU and the lengths
(:func:`setup_line`, read from the config the runs compose) and marks rates and ratios that
are only bounds (:mod:`experiments.report.bound_text`).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from core.workload.synthetic import shared_prefix
from experiments.lib.compose import compose_config
from experiments.lib.results import write_csv
from experiments.report.bound_text import (
    BOUNDS_NOTE,
    gap_text,
    has_bounds,
    rate_text,
    ratio_text,
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

SETTINGS = (("1-shot", 80), ("5-shot", 341))
SYSTEMS = ("orca_oracle", "vllm")
RATES = (2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)
PAPER_RATIO = {"1-shot": 1.67, "5-shot": 3.58}  # §6.4, vLLM / Orca (Oracle)
# the config groups of every run (the paper names no GPU: A100-40GB is kvlab's choice)
BASE = ("model=llama-13b", "hardware=a100-40gb", "workload=shared_prefix")


def searches(duration_s: float, seed: int) -> list[Search]:
    base = (*BASE, f"workload.duration_s={duration_s}", f"seed={seed}")
    out = []
    for name, prefix in SETTINGS:
        for system in SYSTEMS:
            extra = ("system.enable_prefix_caching=true",) if system == "vllm" else ()
            out.append(Search("fig16", name, system, (*base, f"system={system}",
                              f"workload.prefix_len={prefix}", *extra), RATES))  # fmt: skip
    return out


def draw_fig16(cap: pd.DataFrame) -> Any:
    """Fig. 16: the sustained rate of each system per prefix setting.
    ``cap``: :func:`capacity_table` rows (``fig16_capacity.csv``)."""
    fig, ax = pyplot().subplots(figsize=(4.5, 3))
    names = [n for n, _ in SETTINGS]
    for j, system in enumerate(SYSTEMS):
        label, color = SYSTEM_LABELS[system], SYSTEM_COLORS[system]
        rows = [cap[(cap["setting"] == n) & (cap["system"] == system)].iloc[0] for n in names]
        xs = [i + (j - 0.5) * 0.38 for i in range(len(names))]
        rate_bars(ax, xs, rows, 0.38, label=label, color=color)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("sustained rate (req/s)")
    ax.set_title(f"Fig. 16: shared prefix, LLaMA-13B (simulated)\n{BAR_MARKS}", fontsize=7)
    ax.legend(fontsize=7)
    return fig


def write(rows: Sequence[dict[str, Any]], out: Path, plt: Any) -> str:
    """fig16_prefix.csv (every run), fig16_capacity.csv, .png/.pdf; the report section."""
    write_csv(out / "fig16_prefix.csv", pd.DataFrame(rows))
    cap = pd.DataFrame(capacity_table(rows, "orca_oracle"))
    write_csv(out / "fig16_capacity.csv", cap)
    fig = draw_fig16(cap)
    save(fig, out, "fig16_prefix")
    plt.close(fig)
    lines = [
        "## Fig. 16: shared prefix (LLaMA-13B, translation with a few-shot prefix)",
        "",
        setup_line(),
        "",
        *markdown_rows(ratio_table(cap)),
    ]
    if has_bounds(cap):
        lines += ["", BOUNDS_NOTE]
    return "\n".join(lines) + "\n"


def ratio_table(cap: pd.DataFrame) -> pd.DataFrame:
    """The report's table: per prefix setting (:data:`SETTINGS`' order; ``cap``:
    :func:`capacity_table` rows, both :data:`SYSTEMS` for each), the text cells of each
    system's rate, vLLM ÷ Orca (Oracle), the paper's ratio and kvlab's gap to it; rates and
    ratios that are only bounds marked, and the gap a number only where the rates tried
    decide it (``bound_text.rate_text``, ``ratio_text``, ``gap_text``)."""
    rows = {}
    for name, _ in SETTINGS:
        c = cap[cap["setting"] == name].set_index("system")
        rows[name] = [rate_text(c.loc["orca_oracle"]), rate_text(c.loc["vllm"]),
                      ratio_text(c, "orca_oracle"), f"{PAPER_RATIO[name]:.2f}×",
                      gap_text(c, "orca_oracle", PAPER_RATIO[name])]  # fmt: skip
    columns = ["Orca (Oracle) req/s", "vLLM req/s", "vLLM ÷ Orca (Oracle)", "paper", "gap"]
    return pd.DataFrame.from_dict(rows, orient="index", columns=columns).rename_axis("prefix")


def setup_line() -> str:
    """The section's line on the setup the paper leaves open, read from the config every run
    composes (:data:`BASE`) and the generator's length spread: the GPU, and the synthetic
    sentence and translation lengths standing in for WMT16."""
    cfg = compose_config("simulate", BASE)
    w, gpu = cfg.workload, f"{cfg.model.tp} × {str(cfg.hardware.name).upper()}"
    sigma = inspect.signature(shared_prefix).parameters["len_sigma"].default
    return (
        f"Setup the paper leaves open: {gpu} (the paper names no GPU for LLaMA-13B); "
        "synthetic requests stand in for WMT16 En→De: after the shared prefix, random token "
        f"ids with lognormal sentence and translation lengths, mean {w.suffix_len_mean:g} and "
        f"{w.output_len_mean:g} tokens (log-space sigma {sigma:g}; "
        "`configs/workload/shared_prefix.yaml`)."
    )
