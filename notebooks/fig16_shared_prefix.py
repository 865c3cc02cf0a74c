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
# # Fig. 16: shared prefix
#
# Kwon et al., SOSP 2023, Fig. 16 and §6.4: LLaMA-13B translating with a few-shot prefix
# shared by every request; vLLM (prefix blocks shared) reaches 1.67× Orca (Oracle)'s
# throughput with a 1-shot (80-token) prefix and 3.58× with a 5-shot (341-token) one.
# kvlab's sustained rates come from `fig16_capacity.csv` of `python -m
# experiments.reproduce`; the paper's ratios from
# `experiments.report.fig16_prefix.PAPER_RATIO`. Reads `$KVLAB_RESULTS` (default
# `results/reproduce`).

# %%
from _common import read_result, require, require_rows, results_dir, save

from experiments.report.fig16_prefix import PAPER_RATIO, SYSTEMS, draw_fig16, ratio_table

RESULTS = results_dir()
(cap_csv,) = require(RESULTS, "fig16_capacity.csv")
cap = read_result(
    cap_csv,
    text=("setting", "system"),
    choices={"setting": PAPER_RATIO},
    numbers=("max_rate", "rate_lo", "rate_hi"),
    maybe=("first_failing_rate",),
    flags=("rate_open",),
)
require_rows(cap_csv, cap, {"setting": list(PAPER_RATIO), "system": SYSTEMS},
             "the figure has a bar for every setting and system")  # fmt: skip

# %% [markdown]
# The report's table (`experiments.report.fig16_prefix.ratio_table`): each system's
# sustained rate, vLLM ÷ Orca (Oracle), the paper's ratio and the gap to it
# (`bound_text.gap_text`: "not decided" where the rates tried allow a ratio on either side
# of the paper's); a rate or ratio that is only a bound is marked as in the report.

# %%
ratios = ratio_table(cap)
ratios

# %% [markdown]
# The report's figure (`experiments.report.fig16_prefix.draw_fig16`).

# %%
fig = draw_fig16(cap)
save(fig, RESULTS, "fig16_shared_prefix")
