"""The report's clock sections: the preemption price table and the computed gap lines."""

from __future__ import annotations

import pandas as pd

from experiments.report.clock import (
    RATES_CHOSEN,
    block_sections,
    gap_lines,
    preemption_cost,
)
from experiments.reproduce import BLOCK_STUDY_RATES
from sim.cost import RooflineCostModel

SIZES = (1, 16, 256)


def _price(stack: str) -> pd.DataFrame:
    return preemption_cost(
        lambda bs: RooflineCostModel("opt-13b", "a100-40gb", block_size=bs, stack=stack), SIZES
    )


def test_per_copy_latency_makes_small_block_swaps_expensive() -> None:
    grounded, bare = _price("vllm-2023"), _price("none")
    # bytes only: the swap price does not depend on the block size (512 is a multiple)
    assert bare["swap_total_ms"].nunique() == 1
    # with a latency per copy it falls with the block size; recompute does not move
    assert list(grounded["swap_total_ms"]) == sorted(grounded["swap_total_ms"], reverse=True)
    assert grounded["recompute_ms"].nunique() == 1
    assert (grounded["swap_total_ms"] > bare["swap_total_ms"]).all()


def block_study_runs(
    sizes: tuple[int, ...] = SIZES, swap: bool = True, swap_factor: float = 2.0
) -> pd.DataFrame:
    """Fig. 18b recompute runs (ShareGPT, Alpaca) at three block sizes, latencies 0.3, 0.1,
    0.2 s/token; with ``swap``, Fig. 19 ShareGPT swap runs ``swap_factor`` times slower."""
    rows = []
    for bs, lat in zip(sizes, (0.3, 0.1, 0.2), strict=True):
        for wl, rate in (("sharegpt", 2.0), ("alpaca", 25.0)):
            rows.append({"study": "fig18b", "workload": wl, "rate": rate, "block_size": bs,
                         "preemption_mode": "recompute", "normalized_latency": lat,
                         "mean_batch_size": 20.0, "num_preemptions": 3})  # fmt: skip
        if swap:
            rows.append({"study": "fig19", "workload": "sharegpt", "rate": 2.0,
                         "block_size": bs, "preemption_mode": "swap",
                         "normalized_latency": swap_factor * lat, "mean_batch_size": 20.0,
                         "num_preemptions": 4})  # fmt: skip
    return pd.DataFrame(rows)


def test_block_sections_name_the_best_block_and_the_swap_ratio() -> None:
    text = "\n".join(block_sections(block_study_runs(), _price("vllm-2023"), "Clock: test"))
    assert "kvlab's best block size is 16" in text
    assert "the paper's best range is 16–128" in text and "16–32" in text
    assert "| 16 | 0.100 (3) | 0.200 (4) | 2.00 |" in text


def test_the_fig19_gap_reads_the_papers_bound_as_recompute_at_most_1_2x_swap() -> None:
    """§7.3: recompute is never more than 20% above swapping (ratio <= 1.2); the line names
    the block sizes whose price ratio is above that, and only those."""
    price = pd.DataFrame({
        "block_size": [1, 16, 256], "blocks": [512, 32, 2],
        "swap_total_ms": [10.0, 1.0, 0.5], "recompute_ms": [1.0, 1.1, 1.0],
    })  # fmt: skip
    text = "\n".join(block_sections(block_study_runs(), price, "Clock: test"))
    assert "recompute / swap <= 1.2" in text
    assert "0.10–2.00 over all block sizes: above the paper's 1.2 at block sizes 256." in text


def _fig2_runs() -> pd.DataFrame:
    """vLLM and Orca (Oracle) runs as the Fig. 2 gap lines read them."""
    return pd.DataFrame([
        {"system": "vllm", "kv_token_states_pct": 90.0, "kv_free_pct": 5.0,
         "mean_batch_size": 27.24},
        {"system": "orca_oracle", "kv_token_states_pct": 39.0, "kv_free_pct": 1.0,
         "mean_batch_size": 12.0},
    ])  # fmt: skip


def test_a_subset_gets_the_gap_lines_of_its_figures_only() -> None:
    fig2 = _fig2_runs()
    assert [line[:9] for line in gap_lines(fig2, ["fig13"])] == ["- Fig. 13"]
    assert [line[:8] for line in gap_lines(fig2, ["fig2"])] == ["- Fig. 2"]


def test_gap_lines_compare_with_the_paper() -> None:
    fig2 = _fig2_runs()
    text = "\n".join(gap_lines(fig2))
    assert "(paper 96.3%, -6.3 points)" in text
    assert "vLLM's batch is 2.27× Orca (Oracle)'s (paper 2.23×)" in text


def test_tokens_per_request_checks_fig2_against_fig13() -> None:
    """Token share × slots ÷ batch, for kvlab's runs and the paper's two figures."""
    from experiments.report.markdown import PAPER_KV_SLOTS, tokens_per_request_line
    from experiments.report.paper import FIG2_BREAKDOWN, FIG13_BATCH

    runs = pd.DataFrame(
        {
            "system": ["orca_max", "orca_pow2", "orca_oracle", "vllm"],
            "kv_token_states_pct": [20.0, 30.0, 40.0, 100.0],
            "mean_batch_size": [4.0, 6.0, 8.0, 20.0],
        }
    )
    line = tokens_per_request_line(runs, 1000.0)
    assert line is not None
    assert "kvlab 50, 50, 50, 50;" in line and "agree within 0%" in line
    paper = [
        FIG2_BREAKDOWN[s]["token_states"] / 100 * PAPER_KV_SLOTS / FIG13_BATCH[s]
        for s in ("orca_max", "orca_pow2", "orca_oracle", "vllm")
    ]
    assert f"give {', '.join(f'{p:.0f}' for p in paper)}." in line
    assert tokens_per_request_line(runs[runs["system"] != "vllm"], 1000.0) is None


def test_the_block_study_says_its_rates_are_kvlabs_choice() -> None:
    """The paper gives no rate for Fig. 18b or Fig. 19: the sections say theirs are chosen."""
    text = "\n".join(block_sections(block_study_runs(), _price("vllm-2023"), "Clock: test"))
    assert RATES_CHOSEN in text and "the rate is kvlab's choice" in text
    assert all(f"{r:g} req/s" in RATES_CHOSEN for r in BLOCK_STUDY_RATES.values())


def test_the_fig19_gap_says_what_host_link_the_papers_bound_needs() -> None:
    """A swap priced as bytes (20 ms) plus 0.5 ms a block: at block 256 (2 blocks) a 30 ms
    recompute is 1.43x the 21 ms swap; the bound needs the bytes to take 30 / 1.2 - 1 = 24
    ms, a link 20 / 24 = 0.83x as fast. A price of another form gets no such line."""
    price = pd.DataFrame({
        "block_size": [16, 256], "blocks": [32, 2],
        "swap_total_ms": [36.0, 21.0], "recompute_ms": [30.0, 30.0],
    })  # fmt: skip
    text = "\n".join(block_sections(block_study_runs(), price, "Clock: test"))
    assert "(20.0 ms, the same at every block size)" in text
    assert "needs the bytes to take 24.0 ms, a host link 0.83× as fast" in text
    bent = pd.DataFrame({
        "block_size": [1, 16, 256], "blocks": [512, 32, 2],
        "swap_total_ms": [10.0, 1.0, 0.5], "recompute_ms": [1.0, 1.1, 1.0],
    })  # fmt: skip
    assert "What the host link" not in "\n".join(
        block_sections(block_study_runs(), bent, "Clock: test")
    )
