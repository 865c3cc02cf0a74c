"""The end-of-run results table, laid out like ``vllm bench serve``'s: counts, the offered
request rate (``offered_rate``: the requests over their arrival window,
:mod:`core.metrics.summary`) and throughput, then TTFT / TPOT / ITL / E2E latency (mean,
median, p99), then what kvlab adds: the paper's normalized latency, both batch metrics,
the KV-memory breakdown and sharing: ``kv_sharing_saving_pct`` (blocks saved by sharing ÷
blocks needed without it) and ``prefix_cache_hit_pct``, then the run's block copies
(``total_copy_blocks``: copy-on-write) and swaps (``total_swap_out_blocks``,
``total_swap_in_blocks``).

The two batch metrics differ (for vLLM more as prompts arrive more often; see
:mod:`core.metrics.summary`): ``mean_batch_size`` counts the requests
holding KV in the running batch, time-weighted over busy steps (the paper's Fig. 13
"batched requests"); ``mean_step_batch`` counts the requests computed in a step, plain mean
over steps (a prompt-only step of vLLM's 2023 scheduler computes only the new prompts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from experiments.lib.results import REJECT_LABELS

WIDTH = 60

_LATENCIES = (
    ("ttft", "Time to First Token", "TTFT"),
    ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
    ("itl", "Inter-token Latency", "ITL"),
    ("e2el", "End-to-end Latency", "E2EL"),
)
_KV = (
    ("kv_token_states_pct", "Token states"),
    ("kv_reserved_pct", "Reserved (for future tokens)"),
    ("kv_internal_frag_pct", "Internal fragmentation"),
    ("kv_external_frag_pct", "External fragmentation & other"),
    ("kv_free_at_limit_pct", "Free (waiting on a scheduler limit)"),
    ("kv_free_pct", "Free (nobody waiting)"),
)

_MOVES = (
    ("total_copy_blocks", "Copied on the device (copy-on-write)"),
    ("total_swap_out_blocks", "Swapped out to the CPU"),
    ("total_swap_in_blocks", "Swapped in from the CPU"),
)


def _value(x: Any) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if isinstance(x, float):
        return f"{x:.2f}" if abs(x) >= 1 or x == 0 else f"{x:.4g}"
    return str(x)


def _percent(x: Any) -> Any:
    """A share in %, to two decimals like its neighbours (0.06, not 0.05778)."""
    return f"{x:.2f}" if isinstance(x, float) and math.isfinite(x) else x


def _row(label: str, value: Any) -> str:
    return f"{label + ':':<46}{_value(value):>{WIDTH - 46}}"


def _rule(title: str) -> str:
    return f" {title} ".center(WIDTH, "-")


def result_table(metrics: Mapping[str, Any], title: str = "Serving Result") -> str:
    """The table as text (no trailing newline)."""
    m = metrics
    lines = [f" {title} ".center(WIDTH, "=")]
    lines += [
        _row("Successful requests", m.get("completed")),
        _row("Rejected requests", m.get("rejected")),
    ]
    lines += [_row(f"  {label}", m[key]) for key, label in REJECT_LABELS.items() if m.get(key)]
    lines += [
        _row("Duration (s)", m.get("duration_s")),
        _row("Total input tokens", m.get("total_input_tokens")),
        _row("Total generated tokens", m.get("total_output_tokens")),
        _row("Offered request rate (req/s)", m.get("offered_rate")),
        _row("Request throughput (req/s)", m.get("request_throughput")),
        _row("Output token throughput (tok/s)", m.get("output_throughput")),
    ]
    if m.get("goodput") is not None:
        lines.append(_row("Request goodput (req/s)", m.get("goodput")))
    for key, title_, short in _LATENCIES:
        lines.append(_rule(title_))
        for stat in ("mean", "median", "p99"):
            name = {"mean": "Mean", "median": "Median", "p99": "P99"}[stat]
            lines.append(_row(f"{name} {short} (ms)", m.get(f"{stat}_{key}_ms")))
    lines.append(_rule("Normalized latency (Kwon et al. 2023, §6.1)"))
    lines.append(_row("Mean E2E latency / output len (s/token)", m.get("normalized_latency")))
    lines.append(_rule("Batch"))
    lines.append(_row("Requests holding KV (mean_batch_size)", m.get("mean_batch_size")))
    lines.append(_row("Requests computed per step (mean_step_batch)", m.get("mean_step_batch")))
    lines.append(_row("Steps", m.get("num_steps")))
    lines.append(_row("Preemptions", m.get("num_preemptions")))
    lines.append(_rule("KV cache, time-weighted % of slots"))
    lines += [_row(label, _percent(m.get(key))) for key, label in _KV]
    lines.append(_rule("Sharing, %"))
    lines.append(
        _row("Blocks saved by sharing (time-weighted)", _percent(m.get("kv_sharing_saving_pct")))
    )
    lines.append(
        _row("Prompt tokens found in the prefix cache", _percent(m.get("prefix_cache_hit_pct")))
    )
    lines.append(_rule("Block copies and swaps, blocks"))
    lines += [_row(label, m.get(key)) for key, label in _MOVES]
    lines.append("=" * WIDTH)
    return "\n".join(lines)
