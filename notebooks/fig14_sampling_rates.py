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
# # Fig. 14: parallel sampling and beam search
#
# Kwon et al., SOSP 2023, Fig. 14 and §6.3: OPT-13B on Alpaca with parallel sampling
# (n = 2, 4, 6) and beam search (width 2, 4, 6); vLLM's advantage over Orca (Oracle) grows
# from 1.3× in basic sampling to 2.3× at beam width 6 (the one number the paper prints).
# kvlab's sustained rates come from `fig14_capacity.csv` (and every run of the searches
# from `fig14_sampling.csv`) of `python -m experiments.reproduce`; the paper's ratio from
# `experiments.report.fig14_sampling.PAPER_RATIO`. Reads `$KVLAB_RESULTS` (default
# `results/reproduce`).

# %%
from _common import read_result, require, results_dir, save

from experiments.report.fig14_sampling import PAPER_RATIO, SETTINGS, draw_fig14

RESULTS = results_dir()
cap_csv, runs_csv = require(RESULTS, "fig14_capacity.csv", "fig14_sampling.csv")
SETTING_NAMES = [f"{kind} {k}" for kind, k in SETTINGS]
cap = read_result(
    cap_csv,
    text=("setting", "system"),
    choices={"setting": SETTING_NAMES},
    numbers=("max_rate", "rate_lo", "rate_hi"),
    maybe=("vllm_ratio",),
)
ratios = cap[cap["system"] == "orca_oracle"].set_index("setting")[["vllm_ratio"]]
ratios["paper_ratio"] = [PAPER_RATIO.get(s) for s in ratios.index]
ratios.round(2)

# %% [markdown]
# The report's figure (`experiments.report.fig14_sampling.draw_fig14`): each system's
# sustained rate per setting.

# %%
fig = draw_fig14(cap)
save(fig, RESULTS, "fig14_sampling_rates")

# %% [markdown]
# Every rate the searches ran, with whether it passed the normalized-latency threshold.

# %%
runs = read_result(
    runs_csv, text=("setting", "system"), numbers=("rate",), passing=("normalized_latency",)
)
runs.pivot_table(index=["setting", "rate"], columns="system", values="normalized_latency").round(3)
