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
import matplotlib.pyplot as plt
import pandas as pd
from _common import require, results_dir, save

RESULTS = results_dir()
(table1_csv,) = require(RESULTS, "table1.csv")
t1 = pd.read_csv(table1_csv)
t1["setup"] = t1["model"] + "\n" + t1["num_gpus"].astype(str) + "× " + t1["gpu"]
t1["slots_vs_paper_pct"] = 100 * (t1["max_slots"] / t1["paper_slots"] - 1)
t1[["model", "gpu", "num_gpus", "kv_gib", "paper_kv_gib", "max_slots", "paper_slots",
    "slots_vs_paper_pct"]]  # fmt: skip

# %%
fig, ax = plt.subplots(figsize=(5.5, 3.2))
x = range(len(t1))
ax.bar([i - 0.2 for i in x], t1["max_slots"] / 1e3, width=0.4, label="kvlab")
ax.bar([i + 0.2 for i in x], t1["paper_slots"] / 1e3, width=0.4, label="paper (Table 1)")
for i, (slots, diff) in enumerate(zip(t1["max_slots"], t1["slots_vs_paper_pct"], strict=True)):
    ax.annotate(f"{diff:+.1f}%", (i - 0.2, slots / 1e3), ha="center", va="bottom", fontsize=7)
ax.set_xticks(list(x), t1["setup"], fontsize=8)
ax.set_ylabel("KV slots (thousand tokens)")
ax.set_title("Table 1: KV-cache capacity, kvlab vs paper", fontsize=9)
ax.legend(fontsize=8)
save(fig, RESULTS, "table1_kv_capacity")
