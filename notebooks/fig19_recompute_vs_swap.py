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
# # Fig. 19: recompute vs swap
#
# Kwon et al., SOSP 2023, Fig. 19 and §7.3: swapping suffers at small blocks (many small
# transfers), recompute's overhead is flat across block sizes and never above 20 % of
# swapping's, and end to end the two are comparable for blocks 16–64 (OPT-13B, ShareGPT).
# kvlab's (a) price of one preemption comes from `fig19_preemption_cost.csv` (the cost
# model's), its (b) end-to-end runs from `fig19_swap_recompute.csv` of `python -m
# experiments.reproduce`. Reads `$KVLAB_RESULTS` (default `results/reproduce`).

# %%
from _common import read_result, require, require_rows, results_dir, save

from experiments.report.clock import draw_fig19

RESULTS = results_dir()
runs_csv, price_csv = require(RESULTS, "fig19_swap_recompute.csv", "fig19_preemption_cost.csv")
runs = read_result(
    runs_csv,
    text=("study", "workload", "preemption_mode"),
    numbers=("rate", "block_size", "normalized_latency"),
)
require_rows(runs_csv, runs, {"preemption_mode": ("recompute", "swap")},
             "Fig. 19b sets swap beside recompute")  # fmt: skip
price = read_result(price_csv, numbers=("block_size", "blocks", "swap_total_ms", "recompute_ms"))
price["recompute_over_swap"] = price["recompute_ms"] / price["swap_total_ms"]
price.round(3)

# %%
e2e = runs.pivot_table(index="block_size", columns="preemption_mode", values="normalized_latency")
e2e["swap_over_recompute"] = e2e["swap"] / e2e["recompute"]
e2e.round(3)

# %% [markdown]
# The report's figure (`experiments.report.clock.draw_fig19`).

# %%
fig = draw_fig19(runs, price)
save(fig, RESULTS, "fig19_recompute_vs_swap")
