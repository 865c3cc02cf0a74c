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
# # How much of the vLLM batch gap is step time?
#
# kvlab's vLLM batches fewer requests at 2 req/s than the paper's Fig. 13 (30.42). The
# batch at a fixed rate grows when steps are slower (requests stay longer), and the
# roofline cost model is a lower bound on a 2023 stack's step time. `python -m
# experiments.reproduce` reruns vLLM at 2 req/s with a fixed overhead added to every step
# (`vllm_overhead_sensitivity.csv`); this notebook plots what that does to the batch, the
# latency and the KV memory, beside the paper's Fig. 13 batch and Fig. 2 token-state share
# (`experiments.report.paper`). Reads `$KVLAB_RESULTS` (default `results/reproduce`).

# %%
import matplotlib.pyplot as plt
import pandas as pd
from _common import require, results_dir, save

from experiments.report.figures import SOURCE_COLORS
from experiments.report.paper import FIG2_BREAKDOWN, FIG13_BATCH

RESULTS = results_dir()
(sens_csv,) = require(RESULTS, "vllm_overhead_sensitivity.csv")
sens = pd.read_csv(sens_csv).sort_values("per_step_overhead_ms")
sens[["per_step_overhead_ms", "mean_batch_size", "normalized_latency", "kv_token_states_pct",
      "kv_free_pct", "num_preemptions"]]  # fmt: skip

# %%
PANELS = (
    ("mean_batch_size", "mean batched requests", FIG13_BATCH["vllm"], "paper Fig. 13"),
    ("normalized_latency", "normalized latency (s/token)", None, None),
    ("kv_token_states_pct", "token states (% of KV)", FIG2_BREAKDOWN["vllm"]["token_states"],
     "paper Fig. 2"),
)  # fmt: skip
fig, axes = plt.subplots(1, len(PANELS), figsize=(10, 3))
for ax, (column, ylabel, paper, paper_label) in zip(axes, PANELS, strict=True):
    ax.plot(sens["per_step_overhead_ms"], sens[column], marker="o", color=SOURCE_COLORS["kvlab"],
            label="kvlab vLLM")  # fmt: skip
    if paper is not None:
        ax.axhline(paper, color=SOURCE_COLORS["paper"], ls="--", label=paper_label)
        ax.legend(fontsize=7)
    ax.set_xlabel("added overhead (ms/step)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
fig.suptitle("vLLM, OPT-13B, ShareGPT 2 req/s: sensitivity to per-step overhead", fontsize=9)
save(fig, RESULTS, "vllm_step_time_sensitivity")
