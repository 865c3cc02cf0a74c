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
# # Fig. 13: how many requests run together
#
# Kwon et al., SOSP 2023, Fig. 13: the average number of batched requests when serving
# OPT-13B, (a) on ShareGPT at 2 req/s and (b) on Alpaca. kvlab's number is the
# step-time-weighted mean of requests holding KV in the running batch, from `fig13_batch.csv`
# of `python -m experiments.reproduce` (runs `runs/fig2_<system>/` for ShareGPT,
# `runs/fig13_alpaca_<system>/` for Alpaca at `reproduce.FIG13_ALPACA_RATE`, which the
# paper's reference facts do not state). The paper's numbers are those of panel (a)
# (`experiments.report.paper.FIG13_BATCH`); panel (b)'s are not in kvlab's reference
# facts, so none is shown. Reads `$KVLAB_RESULTS` (default `results/reproduce`).

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from _common import read_result, require, results_dir, save

from experiments.report.figures import SYSTEM_COLORS, WORKLOAD_LABELS, fig13_batch
from experiments.report.paper import SYSTEM_LABELS
from experiments.reproduce import FIG2_SYSTEMS

RESULTS = results_dir()
(table_csv,) = require(RESULTS, "fig13_batch.csv")
table = read_result(
    table_csv,
    text=("workload", "system"),
    choices={"workload": WORKLOAD_LABELS, "system": SYSTEM_LABELS},
    numbers=("rate", "kvlab_mean_batch"),
    maybe=("paper_mean_batch",),
)
table.set_index(["workload", "system"]).round(2)

# %% [markdown]
# The report's figure (`experiments.report.figures.fig13_batch`, one panel per workload).

# %%
fig = fig13_batch(table)
save(fig, RESULTS, "fig13_batch_size")

# %% [markdown]
# Beyond the paper's single average: the running batch over time, and its distribution
# weighted by step time (the weighting the mean uses), from each run's `steps.csv`.
# Dashed lines: the paper's averages where known (ShareGPT).

# %%
RUNS = {"sharegpt": "fig2_{}", "alpaca": "fig13_alpaca_{}"}
fig, axes = plt.subplots(len(RUNS), 2, figsize=(9, 6.4), squeeze=False)
for (ax_t, ax_h), (workload, label_fmt) in zip(axes, RUNS.items(), strict=True):
    step_files = require(RESULTS, *(f"runs/{label_fmt.format(s)}/steps.csv" for s in FIG2_SYSTEMS))
    paper = table[table["workload"] == workload].set_index("system")["paper_mean_batch"]
    for system, path in zip(FIG2_SYSTEMS, step_files, strict=True):
        df = read_result(path, numbers=("start_s", "duration_s", "running_requests"))
        color, label = SYSTEM_COLORS[system], SYSTEM_LABELS[system]
        ax_t.plot(df["start_s"], df["running_requests"], drawstyle="steps-post", lw=0.6,
                  color=color, label=label)  # fmt: skip
        bins = np.arange(df["running_requests"].max() + 2) - 0.5
        ax_h.hist(df["running_requests"], bins=bins, weights=df["duration_s"], density=True,
                  histtype="step", color=color, label=label)  # fmt: skip
        if pd.notna(paper.get(system)):
            ax_t.axhline(paper[system], color=color, ls="--", lw=0.8)
            ax_h.axvline(paper[system], color=color, ls="--", lw=0.8)
    name = WORKLOAD_LABELS[workload]
    ax_t.set_xlabel("simulated time (s)")
    ax_t.set_ylabel("running requests")
    ax_t.set_title(f"{name}: running batch over time (kvlab)", fontsize=9)
    ax_h.set_xlabel("running requests")
    ax_h.set_ylabel("share of busy time")
    ax_h.set_title(f"{name}: distribution (time-weighted)", fontsize=9)
axes[0][0].legend(fontsize=7)
save(fig, RESULTS, "fig13_batch_size_over_time")
