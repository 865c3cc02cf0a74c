"""The end-of-run table (experiments.lib.table): one row per metric, numbers aligned."""

from __future__ import annotations

import math

from experiments.lib.table import WIDTH, result_table

_METRICS = {
    "completed": 10, "rejected": 0, "duration_s": 12.5, "request_throughput": 0.8,
    "output_throughput": 160.25, "normalized_latency": 0.02648, "mean_ttft_ms": 35.0,
    "num_steps": 400, "num_preemptions": 0, "kv_token_states_pct": 22.28,
    "kv_reserved_pct": 14.88, "kv_internal_frag_pct": 0.5831, "kv_external_frag_pct": 20.6,
    "kv_free_at_limit_pct": 0.05778, "kv_free_pct": 41.64962, "mean_tpot_ms": math.nan,
}  # fmt: skip


def _cell(table: str, label: str) -> str:
    line = next(line for line in table.splitlines() if line.startswith(label + ":"))
    return line.split(":", 1)[1].strip()


def test_every_line_is_the_table_width_and_small_values_keep_their_digits() -> None:
    table = result_table(_METRICS)
    assert {len(line) for line in table.splitlines()} == {WIDTH}
    assert _cell(table, "Mean E2E latency / output len (s/token)") == "0.02648"
    assert _cell(table, "Request throughput (req/s)") == "0.8"
    assert _cell(table, "Mean TPOT (ms)") == "n/a"


def test_kv_shares_are_percentages_to_two_decimals() -> None:
    table = result_table(_METRICS)
    assert _cell(table, "Free (waiting on a scheduler limit)") == "0.06"
    assert _cell(table, "Internal fragmentation") == "0.58"
    assert _cell(table, "Free (nobody waiting)") == "41.65"
    assert _cell(table, "Token states") == "22.28"


def test_sharing_is_in_the_table() -> None:
    """The memory saved by block sharing and the prefix-cache hits, a sharing study's
    numbers, are rows of the table (they had been in metrics.json alone)."""
    table = result_table({**_METRICS, "kv_sharing_saving_pct": 41.934, "prefix_cache_hit_pct": 0.0})
    assert {len(line) for line in table.splitlines()} == {WIDTH}
    assert _cell(table, "Blocks saved by sharing (time-weighted)") == "41.93"
    assert _cell(table, "Prompt tokens found in the prefix cache") == "0.00"
    assert _cell(result_table(_METRICS), "Blocks saved by sharing (time-weighted)") == "n/a"


def test_block_copies_and_swaps_are_in_the_table() -> None:
    """A parallel-sampling or beam study's copy-on-write copies, and the blocks swapped,
    are rows of the table under their own rule, after the sharing rows."""
    moves = {"total_copy_blocks": 8751, "total_swap_out_blocks": 890, "total_swap_in_blocks": 0}
    table = result_table({**_METRICS, **moves})
    lines = table.splitlines()
    assert {len(line) for line in lines} == {WIDTH}
    assert _cell(table, "Copied on the device (copy-on-write)") == "8751"
    assert _cell(table, "Swapped out to the CPU") == "890"
    assert _cell(table, "Swapped in from the CPU") == "0"
    rule = lines.index(" Block copies and swaps, blocks ".center(WIDTH, "-"))
    assert lines[rule - 1].startswith("Prompt tokens found in the prefix cache")
    assert lines[rule + 1].startswith("Copied on the device")
