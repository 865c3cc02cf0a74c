"""Behaviour of the capacity searches (experiments/report/rate_search.py, fig12_rates.py)
and of the KV sizing (sim/capacity.py) that a mutation audit found no test pinned down:
each test here fails under such a mutant, and the first two under the code before their
fix (one bisection asked for ran two; two rates shared a run label)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from experiments.lib.checks import ConfigError
from experiments.report import fig12_rates
from experiments.report.rate_search import (
    Search,
    capacity_table,
    max_rate,
    passes,
    rate_label,
    run_search,
)
from sim.capacity import activation_bytes, kv_capacity
from sim.catalog import get_model

GIB = 1024**3


def runner(capacity: float, requests=lambda rate: 200):
    """Latency 0.5 s/token at or under ``capacity``, 5 above; ``requests(rate)`` of them."""

    def run(label: str, overrides: list[str]) -> dict:
        rate = float(next(o.split("=")[1] for o in overrides if o.startswith("workload.rate=")))
        seed = next((int(o.split("=")[1]) for o in overrides if o.startswith("seed=")), 0)
        ok = rate <= capacity
        n = requests(rate)
        return {"num_requests": n, "completed": n, "normalized_latency": 0.5 if ok else 5.0,
                "mean_e2el_ms": 1000.0 * rate,
                "unfinished_at_last_arrival": (0.02 + 0.02 * seed) if ok else 0.3}  # fmt: skip

    return run


RATES = (0.5, 1.0, 2.0, 4.0, 8.0)


def search(system: str, setting: str = "s", **kw) -> Search:
    return Search("t", setting, system, (), kw.pop("rates", RATES), seeds=(0,), trace_s=60.0,
                  **kw)  # fmt: skip


def test_one_bisection_asked_for_runs_one() -> None:
    rows = run_search(runner(3.1), search("vllm", bisect_evals=1, stop_after=1), 1.0)
    assert [r["rate"] for r in rows] == [0.5, 1.0, 2.0, 4.0, 3.0]


def test_every_rate_tried_has_a_label_of_its_own() -> None:
    assert [rate_label(r) for r in (1.0, 0.5, 3.25, 8)] == ["1", "0.5", "3.25", "8"]
    assert rate_label(1.00048828125) == "1.00048828125"
    rows = run_search(runner(1.0003), search("vllm", rates=(0.5, 1.0, 2.0), bisect_evals=20,
                                             rate_tol=0.0005), 1.0)  # fmt: skip
    labels = [r["label"] for r in rows]
    assert len(rows) > 10 and len(set(labels)) == len(labels)


def test_a_run_passes_at_its_threshold_and_counts_its_backlog_whole() -> None:
    run = {"num_requests": 149, "completed": 149, "normalized_latency": 1.0}
    assert passes(run, 1.0)
    # 15 of 149 unfinished: over 10% of 149 (14.9); 15/149 * 149 is 14.999..., not 15
    assert not passes(run | {"unfinished_at_last_arrival": 15 / 149}, 1.0, 0.1)
    assert passes(run | {"unfinished_at_last_arrival": 14 / 149}, 1.0, 0.1)


def test_the_rate_is_below_the_lowest_failure_on_a_noisy_curve() -> None:
    rows = [{"rate": r, "seed": 0, "passes": ok}
            for r, ok in ((1.0, True), (2.0, False), (3.0, True), (4.0, False))]  # fmt: skip
    assert max_rate(rows) == 1.0


def test_a_baseline_that_passes_nothing_is_infinitely_slower() -> None:
    rows = run_search(runner(2.0), search("vllm"), 1.0)
    rows += run_search(runner(0.1), search("orca_oracle"), 1.0)
    table = {r["system"]: r for r in capacity_table(rows, "vllm")}
    assert table["orca_oracle"]["vllm_ratio"] == math.inf


def panel_rows(letter: str, vllm: float, oracle: float, evals: int = 0) -> list[dict]:
    rows = run_search(runner(vllm), search("vllm", letter, bisect_evals=evals), 1.0)
    return rows + run_search(runner(oracle), search("orca_oracle", letter, bisect_evals=evals),
                             1.0)  # fmt: skip


def test_the_alpaca_gap_narrows_when_it_does() -> None:
    # (d): 6 / 2.5 = 2.4x; (f): 3 / 2.5 = 1.2x, each bracketed finely enough not to overlap
    cap = fig12_rates.capacity(panel_rows("d", 6.0, 2.5, 6) + panel_rows("f", 3.0, 2.5, 6))
    text = " ".join(fig12_rates._narrowing(cap))
    assert "gap narrows" in text and "inverts" not in text


def test_the_columns_at_the_rate_describe_its_runs() -> None:
    def requests(rate: float) -> int:
        return int(100 * rate)

    rows = []
    for seed in (0, 1):
        s = Search("t", "a", "vllm", (), RATES, seeds=(seed,), bisect_evals=0, trace_s=60.0)
        rows += run_search(runner(3.0, requests), s, 1.0)
    cap = fig12_rates.capacity(rows).set_index("system")
    assert cap.loc["vllm", "max_rate"] == 2.0
    assert cap.loc["vllm", "requests_at_rate"] == 200  # not the failing rate's 400
    assert cap.loc["vllm", "backlog_at_rate"] == pytest.approx(0.03)  # the seeds' mean


def test_a_point_ratio_outside_the_range_is_measured_from_the_nearer_end() -> None:
    c = pd.DataFrame({"max_rate": [9.0, 3.0], "first_failing_rate": [9.1, 3.1]},
                     index=["vllm", "orca_oracle"])  # fmt: skip
    assert fig12_rates._exact_verdict(c, "orca_oracle", 3.0, 1.7, 2.7) == "outside by +0.30×"
    assert fig12_rates._exact_verdict(c, "orca_oracle", 1.5, 1.7, 2.7) == "outside by -0.20×"


def test_curves_are_checked_by_their_worst_seed(tmp_path: Path) -> None:
    curves = pd.DataFrame({"passes": [True], "normalized_latency_max": [1.2],
                           "normalized_latency_mean": [0.8]})  # fmt: skip
    with pytest.raises(ConfigError, match=r"line 2 passes with normalized_latency_max 1\.2"):
        fig12_rates.check_curves(curves, 1.0, tmp_path / "fig12_curves.csv")


def test_a_given_cache_is_split_over_the_gpus() -> None:
    cap = kv_capacity("opt-13b", "a100-40gb", tp=2, kv_cache_bytes=12 * GIB)
    assert cap.kv_bytes_total == 12 * GIB


def test_the_forward_peak_holds_the_mlps_activated_output() -> None:
    m = get_model("opt-13b")  # not gated: the MLP's output and its activated copy
    h, ffn = m.hidden_size, m.ffn_hidden_size
    qkv = m.q_size + 2 * m.num_kv_heads * m.head_dim
    assert 2 * ffn > qkv
    assert activation_bytes(m, 1, 8192, 0) == 8192 * (2 * h + 2 * ffn) * 2


def test_bisection_starts_from_the_lowest_failing_rate() -> None:
    """The grid stops after two failures in a row (2 and 4 at capacity 1.2); the bisection
    brackets between the highest passing rate and the LOWEST failing one, so its one rate
    is 1.5 (between 1 and 2) and no rate is run twice."""
    rows = run_search(runner(1.2), search("vllm", bisect_evals=1), 1.0)
    rates = [r["rate"] for r in rows]
    assert rates == [0.5, 1.0, 2.0, 4.0, 1.5]


def test_the_low_seed_end_is_open_only_when_every_seed_at_it_never_failed() -> None:
    """Two seeds share the interval's low end, 2: seed 0 never failed (its run at 3 held no
    request), seed 1 failed at 3, which brackets the low end (the least of the seeds' rates
    is below 3), so ``rate_lo_open`` is False; the high end, from seed 0, is open."""
    runs = ((0, 1.0, True), (1, 1.0, True), (0, 2.0, True), (1, 2.0, True),
            (0, 3.0, None), (1, 3.0, False))  # fmt: skip
    rows = [{"setting": "s", "system": "vllm", "seed": seed, "rate": rate, "passes": ok}
            for seed, rate, ok in runs]  # fmt: skip
    (v,) = capacity_table(rows, "vllm")
    assert (v["rate_lo"], v["rate_hi"]) == (2.0, 2.0)
    assert not v["rate_lo_open"] and v["rate_hi_open"]


def test_the_paper_length_trace_is_taken_with_full() -> None:
    """``trace_s``: a duration given wins; else ``--full`` takes the paper's length (15 min
    for OPT-175B), the default the panel's shorter one."""
    c = fig12_rates.BY_LETTER["c"]
    assert (c.full_s, c.default_s) == (900.0, 400.0)
    assert fig12_rates.trace_s(c, True, None) == 900.0
    assert fig12_rates.trace_s(c, False, None) == 400.0
    assert fig12_rates.trace_s(c, True, 120.0) == 120.0
    (s, *_) = fig12_rates.searches([c], True, None, (0,), bisect_evals=0)
    assert s.trace_s == 900.0 and "workload.duration_s=900.0" in s.fixed
