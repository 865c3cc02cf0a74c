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
from _common import read_result, require, results_dir, save

from experiments.report.figures import overhead_sensitivity

RESULTS = results_dir()
(sens_csv,) = require(RESULTS, "vllm_overhead_sensitivity.csv")
SHOWN = (
    "per_step_overhead_ms",
    "mean_batch_size",
    "normalized_latency",
    "kv_token_states_pct",
    "kv_free_pct",
    "num_preemptions",
)
sens = read_result(sens_csv, numbers=SHOWN).sort_values("per_step_overhead_ms")
sens[list(SHOWN)]

# %% [markdown]
# The report's figure (`experiments.report.figures.overhead_sensitivity`): batch, latency
# and token-state share against the added overhead, the paper's Fig. 13 batch and Fig. 2
# share as dashed lines.

# %%
fig = overhead_sensitivity(sens)
save(fig, RESULTS, "vllm_step_time_sensitivity")
