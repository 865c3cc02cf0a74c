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
# # Fig. 12: normalized latency vs request rate (OPT-13B, ShareGPT)
#
# Kwon et al., SOSP 2023, Fig. 12 and §6.2: each system's normalized latency (mean of
# end-to-end latency / output length, s/token) as the request rate grows; vLLM sustains
# 1.7–2.7× the rate of Orca (Oracle), 2.7–8× Orca (Max) and up to 22× FasterTransformer
# (ranges over three model sizes). kvlab's curves and sustainable rates come from
# `fig12_opt13b_sharegpt.csv` and `fig12_capacity.csv` of `python -m experiments.reproduce`;
# the paper's ranges from `experiments.report.paper`. Reads `$KVLAB_RESULTS` (default
# `results/reproduce`).

# %%
import math

import matplotlib.pyplot as plt
import pandas as pd
from _common import require, results_dir, save

from experiments.report.paper import FIG12_SHAREGPT_RATIO, SYSTEM_LABELS
from experiments.reproduce import sustainable_rates

# The normalized-latency bound (s/token) a sustained rate must meet: reproduce's
# `--threshold` (default 1.0). Checked against fig12_capacity.csv below.
THRESHOLD = 1.0

RESULTS = results_dir()
curves_csv, capacity_csv = require(RESULTS, "fig12_opt13b_sharegpt.csv", "fig12_capacity.csv")
curves = pd.read_csv(curves_csv)
capacity = pd.read_csv(capacity_csv)
recomputed = sustainable_rates(curves, THRESHOLD).set_index("system")["max_rate"]
if not recomputed.sort_index().equals(capacity.set_index("system")["max_rate"].sort_index()):
    raise ValueError(
        f"fig12_capacity.csv does not match THRESHOLD = {THRESHOLD:g} s/token: set THRESHOLD "
        "to the --threshold the results were made with"
    )
capacity["paper_ratio"] = [FIG12_SHAREGPT_RATIO.get(s) for s in capacity["system"]]
capacity

# %% [markdown]
# Left: the curves, the threshold and each system's sustainable rate (open circle).
# Right: vLLM's sustainable rate as a multiple of each baseline's (kvlab: dot; an arrow
# at the top when the baseline sustains no rate on the grid), beside the paper's range
# over three model sizes (bar; "up to" ranges start at 1).

# %%
fig, (ax_c, ax_r) = plt.subplots(1, 2, figsize=(9.5, 3.6))
for i, (system, df) in enumerate(curves.groupby("system", sort=False)):
    df = df.sort_values("rate")
    ax_c.plot(df["rate"], df["normalized_latency"], marker="o", ms=2.5, color=f"C{i}",
              label=SYSTEM_LABELS.get(system, system))  # fmt: skip
    best = df[df["rate"] == capacity.set_index("system").loc[system, "max_rate"]]
    ax_c.plot(best["rate"], best["normalized_latency"], "o", mfc="none", ms=8, color=f"C{i}")
ax_c.axhline(THRESHOLD, color="k", lw=0.6, ls=":", label=f"threshold {THRESHOLD:g} s/token")
ax_c.set_ylim(0, 2 * THRESHOLD)
ax_c.set_xlabel("request rate (req/s)")
ax_c.set_ylabel("normalized latency (s/token)")
ax_c.set_title("kvlab, OPT-13B, ShareGPT (simulated)", fontsize=9)
ax_c.legend(fontsize=7)

baselines = capacity[capacity["system"] != "vllm"].reset_index(drop=True)
top = 40.0
paper = baselines["paper_ratio"].map(lambda r: r if r and r[1] is not None else None).dropna()
ax_r.vlines(paper.index + 0.15, [lo or 1.0 for lo, _ in paper], [hi for _, hi in paper],
            color="C1", lw=6, alpha=0.6, label="paper (range)")  # fmt: skip
finite = baselines["vllm_ratio"].map(math.isfinite)
ax_r.plot(baselines.index[finite] - 0.15, baselines["vllm_ratio"][finite], "o", color="C0",
          label="kvlab")  # fmt: skip
for i in baselines.index[~finite]:
    ax_r.annotate("∞", (i - 0.15, top), ha="center", va="top", color="C0")
ax_r.set_yscale("log")
ax_r.set_ylim(1, top)
ax_r.set_xticks(range(len(baselines)), [SYSTEM_LABELS[s] for s in baselines["system"]],
                fontsize=7)  # fmt: skip
ax_r.set_ylabel("vLLM rate / system rate")
ax_r.set_title("sustainable-rate ratio", fontsize=9)
ax_r.legend(fontsize=7)
save(fig, RESULTS, "fig12_latency_vs_rate")
