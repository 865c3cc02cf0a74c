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
# # Table 1: KV-cache capacity, computed vs the paper
#
# Kwon et al., SOSP 2023, §6.1 Table 1 lists, per model and GPU setup, the memory left for
# the KV cache and how many token slots it holds. kvlab recomputes them from model shapes
# and GPU memory (`sim.capacity.table1`); `table1.csv` carries the paper's numbers beside
# them (`paper_*` columns). Reads `table1.csv` from `$KVLAB_RESULTS`
# (default `results/reproduce`); run `python -m experiments.reproduce` first.

# %%
from _common import read_result, require, results_dir, save

from experiments.report.figures import table1_capacity

RESULTS = results_dir()
(table1_csv,) = require(RESULTS, "table1.csv")
t1 = read_result(
    table1_csv,
    text=("model", "gpu"),
    numbers=("num_gpus", "kv_gib", "paper_kv_gib", "max_slots", "paper_slots"),
)
t1["slots_vs_paper_pct"] = 100 * (t1["max_slots"] / t1["paper_slots"] - 1)
t1[["model", "gpu", "num_gpus", "kv_gib", "paper_kv_gib", "max_slots", "paper_slots",
    "slots_vs_paper_pct"]]  # fmt: skip

# %% [markdown]
# The report's figure (`experiments.report.figures.table1_capacity`): kvlab's slots beside
# the paper's, kvlab's difference in percent on its bar.

# %%
fig = table1_capacity(t1)
save(fig, RESULTS, "table1_kv_capacity")
