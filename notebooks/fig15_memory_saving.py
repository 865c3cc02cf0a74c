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
# # Fig. 15: memory saved by sharing
#
# Kwon et al., SOSP 2023, Fig. 15 and §6.3: with parallel sampling vLLM's block sharing
# saves 6.1–9.8 % of KV memory, with beam search 37.6–55.2 % (OPT-13B, Alpaca), the saving
# being (blocks saved by sharing) / (blocks needed without sharing). kvlab's savings, time
# weighted over each vLLM run of Fig. 14's searches, come from `fig15_sharing.csv` of
# `python -m experiments.reproduce`; the paper's ranges from
# `experiments.report.fig15_sharing.PAPER_RANGE`. Reads `$KVLAB_RESULTS` (default
# `results/reproduce`).

# %%
from _common import read_result, require, results_dir, save

from experiments.report.fig14_sampling import SETTINGS
from experiments.report.fig15_sharing import PAPER_RANGE, draw_fig15

RESULTS = results_dir()
(table_csv,) = require(RESULTS, "fig15_sharing.csv")
table = read_result(
    table_csv,
    text=("setting",),
    maybe=("saving_pct",),
    choices={"setting": [f"{kind} {k}" for kind, k in SETTINGS]},
)
table["paper_range_pct"] = [PAPER_RANGE[s.split()[0]] for s in table["setting"]]
table

# %% [markdown]
# The report's figure (`experiments.report.fig15_sharing.draw_fig15`): kvlab's saving at
# each setting's highest sustained rate, over the paper's range (band).

# %%
fig = draw_fig15(table)
save(fig, RESULTS, "fig15_memory_saving")
