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
# OPT-13B on ShareGPT at 2 req/s. kvlab's number is the step-time-weighted mean of requests
# holding KV in the running batch (`mean_batch_size` of `runs/fig2_<system>/metrics.json`);
# the paper's is in `experiments.report.paper`. Reads `$KVLAB_RESULTS` (default
# `results/reproduce`).

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from _common import read_metrics, require, results_dir, save

from experiments.report.figures import SYSTEM_COLORS, fig13_batch
from experiments.report.markdown import fig13_table
from experiments.report.paper import FIG13_BATCH, SYSTEM_LABELS
from experiments.reproduce import FIG2_SYSTEMS

RESULTS = results_dir()
table = fig13_table(read_metrics(RESULTS, {s: f"fig2_{s}" for s in FIG2_SYSTEMS}))
table.set_index("system").round(2)

# %%
fig = fig13_batch(table)
save(fig, RESULTS, "fig13_batch_size")

# %% [markdown]
# Beyond the paper's single average: the running batch over time, and its distribution
# weighted by step time (the weighting the mean uses), from each run's `steps.csv`.
# Dashed lines: the paper's averages.

# %%
step_files = require(RESULTS, *(f"runs/fig2_{s}/steps.csv" for s in FIG2_SYSTEMS))
steps = {s: pd.read_csv(p) for s, p in zip(FIG2_SYSTEMS, step_files, strict=True)}
fig, (ax_t, ax_h) = plt.subplots(1, 2, figsize=(9, 3.4))
for system, df in steps.items():
    color, label = SYSTEM_COLORS[system], SYSTEM_LABELS[system]
    ax_t.plot(df["start_s"], df["running_requests"], drawstyle="steps-post", lw=0.6,
              color=color, label=label)  # fmt: skip
    bins = np.arange(df["running_requests"].max() + 2) - 0.5
    ax_h.hist(df["running_requests"], bins=bins, weights=df["duration_s"], density=True,
              histtype="step", color=color, label=label)  # fmt: skip
    ax_t.axhline(FIG13_BATCH[system], color=color, ls="--", lw=0.8)
    ax_h.axvline(FIG13_BATCH[system], color=color, ls="--", lw=0.8)
ax_t.set_xlabel("simulated time (s)")
ax_t.set_ylabel("running requests")
ax_t.legend(fontsize=7)
ax_h.set_xlabel("running requests")
ax_h.set_ylabel("share of busy time")
ax_h.set_title("distribution (time-weighted)", fontsize=9)
ax_t.set_title("running batch over time (kvlab)", fontsize=9)
save(fig, RESULTS, "fig13_batch_size_over_time")
