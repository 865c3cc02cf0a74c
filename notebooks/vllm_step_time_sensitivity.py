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
# batch at a fixed rate grows when steps are slower (requests stay longer). `python -m
# experiments.reproduce` reruns vLLM at 2 req/s with a fixed time added to every step, on
# the report's clock (what time per step it does not model would change) and on the bare
# roofline, a lower bound on a 2023 stack's step time (`vllm_overhead_sensitivity.csv`,
# column `clock`); this notebook plots what that does to the batch, the latency and the KV
# memory, beside the paper's Fig. 13 batch and Fig. 2 token-state share
# (`experiments.report.paper`). Reads `$KVLAB_RESULTS` (default `results/reproduce`).

# %%
from _common import read_result, require, results_dir, save

from experiments.report.figures import overhead_sensitivity, with_clock_columns

RESULTS = results_dir()
(sens_csv,) = require(RESULTS, "vllm_overhead_sensitivity.csv")
SHOWN = (
    "clock",
    "per_step_overhead_ms",
    "mean_batch_size",
    "normalized_latency",
    "kv_token_states_pct",
    "kv_free_pct",
    "num_preemptions",
)
sens = with_clock_columns(read_result(sens_csv, numbers=SHOWN[1:]))
sens = sens.sort_values(["report_clock", "per_step_overhead_ms"], ascending=[False, True])
sens[list(SHOWN)]

# %% [markdown]
# The report's figure (`experiments.report.figures.overhead_sensitivity`): batch, latency
# and token-state share against the added overhead, a line per clock (the bare roofline
# dotted), the paper's Fig. 13 batch and Fig. 2 share as dashed lines.

# %%
fig = overhead_sensitivity(sens)
save(fig, RESULTS, "vllm_step_time_sensitivity")
