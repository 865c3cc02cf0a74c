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
# # Fig. 17: chatbot
#
# Kwon et al., SOSP 2023, Fig. 17 and §6.5: OPT-13B serving conversations whose prompt is
# the history truncated to its last 1024 tokens; vLLM sustains 2× the request rate of the
# three Orca variants. kvlab's curves come from `fig17_chatbot.csv` (every run of the
# searches) and the sustained rates from `fig17_capacity.csv` of `python -m
# experiments.reproduce`; the paper's ratio from
# `experiments.report.fig17_chatbot.PAPER_RATIO`. Reads `$KVLAB_RESULTS` (default
# `results/reproduce`).

# %%
from _common import read_result, require, require_rows, results_dir, save

from experiments.report.fig17_chatbot import PAPER_RATIO, SYSTEMS, draw_fig17

RESULTS = results_dir()
runs_csv, cap_csv = require(RESULTS, "fig17_chatbot.csv", "fig17_capacity.csv")
runs = read_result(runs_csv, text=("system",), numbers=("rate",), passing=("normalized_latency",))
cap = read_result(cap_csv, text=("system",), numbers=("max_rate",), maybe=("vllm_ratio",))
for path, table in ((runs_csv, runs), (cap_csv, cap)):
    require_rows(path, table, {"system": SYSTEMS}, "the figure has a curve for every system")
cap = cap.set_index("system")
cap["paper_ratio"] = [None if s == "vllm" else PAPER_RATIO for s in cap.index]
cap.round(2)

# %% [markdown]
# The report's figure (`experiments.report.fig17_chatbot.draw_fig17`): normalized latency
# against request rate per system.

# %%
fig = draw_fig17(runs)
save(fig, RESULTS, "fig17_chatbot_rates")
