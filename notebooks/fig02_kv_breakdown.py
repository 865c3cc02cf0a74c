# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Fig. 2: where the KV-cache memory goes
#
# Kwon et al., SOSP 2023, Fig. 2: the average share of KV memory holding token states,
# reserved for future tokens, lost to internal and to external fragmentation, for Orca
# (Max/Pow2/Oracle) and vLLM serving OPT-13B on ShareGPT. kvlab's shares come from the
# `runs/fig2_<system>/` runs of `python -m experiments.reproduce` (ShareGPT at 2 req/s);
# the paper's from `experiments.report.paper`. Reads `$KVLAB_RESULTS` (default
# `results/reproduce`).

# %%
import matplotlib.pyplot as plt
import pandas as pd
from _common import read_metrics, read_result, require, results_dir, save

from core.metrics.summary import memory_shares
from experiments.report.figures import KV_PARTS, PART_COLORS, PART_LABELS, fig2_breakdown
from experiments.report.markdown import fig2_table
from experiments.report.paper import SYSTEM_LABELS
from experiments.reproduce import FIG2_SYSTEMS

RESULTS = results_dir()
runs = read_metrics(
    RESULTS, {s: f"fig2_{s}" for s in FIG2_SYSTEMS}, numbers=[f"kv_{p}_pct" for p in KV_PARTS]
)
table = fig2_table(runs)
table.set_index("system").round(1)

# %% [markdown]
# Time-averaged breakdown: kvlab's bar beside the paper's for each system
# (`experiments.report.figures`, the report's figure). "Free" is free slots while nobody
# waits; the paper shows no such bar.

# %%
fig = fig2_breakdown(table)
save(fig, RESULTS, "fig02_kv_breakdown")

# %% [markdown]
# A study the paper did not show: the breakdown over time within each run. Steps are
# grouped into time windows and each window's shares are computed with the same
# definition as the summary (`core.metrics.summary.memory_shares`, weighted by step time).

# %%
WINDOWS = 40


def shares_over_time(steps: pd.DataFrame, windows: int = WINDOWS) -> pd.DataFrame:
    """Per time window (index: window start, s): the KV shares in percent."""
    edges = pd.cut(steps["start_s"], windows)
    rows = {w.left: memory_shares(group) for w, group in steps.groupby(edges, observed=True)}
    return pd.DataFrame.from_dict(rows, orient="index").sort_index()


step_files = require(RESULTS, *(f"runs/fig2_{s}/steps.csv" for s in FIG2_SYSTEMS))
STEP_NUMBERS = (
    "start_s",
    "duration_s",
    "num_waiting",
    "num_swapped",
    "queue_held_by",
    "kv_free",
    "kv_token_states",
    "kv_reserved",
    "kv_internal_frag",
    "kv_allocator_padding",
)
over_time = {
    s: shares_over_time(read_result(p, numbers=STEP_NUMBERS))
    for s, p in zip(FIG2_SYSTEMS, step_files, strict=True)
}
fig, axes = plt.subplots(len(over_time), 1, figsize=(6, 6), sharex=True)
for ax, (system, df) in zip(axes, over_time.items(), strict=True):
    ax.stackplot(df.index, *(df[f"kv_{p}_pct"] for p in KV_PARTS),
                 colors=[PART_COLORS[p] for p in KV_PARTS])  # fmt: skip
    ax.set_ylim(0, 100)
    ax.set_ylabel(f"{SYSTEM_LABELS[system]}\n(%)", fontsize=8)
axes[0].set_title("kvlab's KV breakdown over time, OPT-13B, ShareGPT 2 req/s", fontsize=9)
axes[-1].set_xlabel("simulated time (s)")
axes[-1].legend([PART_LABELS[p] for p in KV_PARTS], fontsize=6, ncol=3, loc="upper center",
                bbox_to_anchor=(0.5, -0.5))  # fmt: skip
save(fig, RESULTS, "fig02_kv_breakdown_over_time")
