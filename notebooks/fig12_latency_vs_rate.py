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
# # Fig. 12 (a)–(f): normalized latency vs request rate
#
# Kwon et al., SOSP 2023, Fig. 12 and §6.2: each system's normalized latency (mean of
# end-to-end latency / output length, s/token) as the request rate grows, on OPT-13B
# (1 × A100-40GB), OPT-66B (4 × A100-40GB) and OPT-175B (8 × A100-80GB), ShareGPT (a–c)
# and Alpaca (d–f). On ShareGPT vLLM sustains 1.7–2.7× the rate of Orca (Oracle), 2.7–8×
# Orca (Max) and up to 22× FasterTransformer (ranges over the three sizes).
#
# kvlab's curves (mean over seeds, min and max) and sustainable rates (with their interval
# over seeds) come from `fig12_curves.csv` and `fig12_capacity.csv` of
# `python -m experiments.reproduce`; reads `$KVLAB_RESULTS` (default `results/reproduce`).

# %%
from _common import read_result, require, require_rows, results_dir, save

from experiments.report.fig12_rates import (
    BY_LETTER,
    capacity_view,
    check_curves,
    recorded_threshold,
)
from experiments.report.figures import fig12_panels

RESULTS = results_dir()
curves_csv, capacity_csv = require(RESULTS, "fig12_curves.csv", "fig12_capacity.csv")
AT_RATE = ("trace_s", "requests_at_rate", "mean_e2el_s_at_rate", "backlog_at_rate")
capacity = read_result(
    capacity_csv,
    text=("panel", "system", "ratio_lo_bound", "ratio_hi_bound"),
    choices={"panel": BY_LETTER},
    numbers=("max_rate", "rate_lo", "rate_hi"),
    maybe=("first_failing_rate", "ratio_lo", "ratio_hi", *AT_RATE),
    flags=("rate_open", "rate_lo_open", "rate_hi_open"),
)
# The normalized-latency bound (s/token) a sustained rate had to meet: the run's
# `--threshold`, recorded in fig12_capacity.csv.
THRESHOLD = recorded_threshold(capacity, capacity_csv)
curves = read_result(
    curves_csv,
    text=("panel", "system"),
    numbers=("rate",),
    flags=("passes",),
    passing=("normalized_latency_mean", "normalized_latency_min", "normalized_latency_max"),
)
PAIRS = capacity[["panel", "system"]]
require_rows(curves_csv, curves, PAIRS, f"the figure draws one for each in {capacity_csv.name}")
check_curves(curves, THRESHOLD, curves_csv)

# %% [markdown]
# The report's tables (`experiments.report.fig12_rates.capacity_view`): per panel and
# system, the sustained rate with its interval over seeds, and vLLM's ratio to it; a rate
# or ratio that is only a bound is marked as in the report (≥, ≤, >, <).

# %%
view = capacity_view(capacity)
view

# %% [markdown]
# The report's figure (`experiments.report.figures.fig12_panels`): per panel, each system's
# mean normalized latency over seeds with the min–max shaded (a rate that failed: a hollow
# square), the threshold (dotted), the sustainable rate (open circle) with its interval
# over seeds, and the end of the paper's x-axis (grey).

# %%
panels = [(p, BY_LETTER[p].title, BY_LETTER[p].axis) for p in sorted(set(capacity["panel"]))]
fig = fig12_panels(curves, capacity, THRESHOLD, panels)
save(fig, RESULTS, "fig12_latency_vs_rate")
