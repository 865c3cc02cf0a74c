"""End-to-end checks of the Hydra experiments (small runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments.report.paper import FIG13_BATCH, SYSTEM_LABELS
from experiments.reproduce import FIG2_SYSTEMS, compose_config
from experiments.simulate import run

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
SMALL = ["workload.duration_s=null", "workload.num_requests=60", "workload.rate=4"]


def test_simulate_writes_result_files_with_bench_keys(tmp_path):
    metrics = run(compose_config([*SMALL, "system=orca_pow2"]), tmp_path)
    for name in ("config.yaml", "metrics.json", "requests.csv", "steps.csv", "cost_model.json"):
        assert (tmp_path / name).exists(), name
    saved = json.loads((tmp_path / "metrics.json").read_text())
    for key in (
        "request_throughput", "output_throughput", "mean_ttft_ms", "median_tpot_ms",
        "p99_itl_ms", "mean_e2el_ms", "normalized_latency", "mean_batch_size",
        "kv_token_states_pct", "kv_reserved_pct", "kv_internal_frag_pct", "kv_external_frag_pct",
    ):  # fmt: skip
        assert key in saved, key
    assert saved["completed"] == 60 == metrics["completed"]
    parts = ("token_states", "reserved", "internal_frag", "external_frag", "free")
    shares = sum(saved[f"kv_{k}_pct"] for k in parts)
    assert shares == pytest.approx(100.0)
    steps = pd.read_csv(tmp_path / "steps.csv")
    requests = pd.read_csv(tmp_path / "requests.csv")
    assert len(requests) == 60 and (requests["status"] == "finished").all()
    assert steps["duration_s"].gt(0).all()


@pytest.mark.parametrize("system", ["vllm", "orca_pow2"])
def test_kv_slots_is_the_capacity_every_step_accounts_for(tmp_path, system):
    """OPT-13B on an A100-40GB: 15,459 slots of memory, 120 whole blocks of 128 in a run."""
    metrics = run(compose_config([*SMALL, f"system={system}", "system.block_size=128"]), tmp_path)
    steps = pd.read_csv(tmp_path / "steps.csv")
    parts = ["kv_token_states", "kv_reserved", "kv_internal_frag", "kv_allocator_padding",
             "kv_free"]  # fmt: skip
    assert (steps[parts].sum(axis=1) == metrics["kv_slots"]).all()
    assert metrics["kv_slots"] == 120 * 128


def test_a_swap_run_counts_the_preemptions_its_full_cpu_pool_recomputed(tmp_path):
    """0.02 GiB holds one block of OPT-13B's KV: the swap run's later preemptions recompute
    (vLLM v0.1 would abort); with vLLM's 4 GiB none do, and a recompute run has none."""
    tight = [*SMALL, "num_gpu_blocks=300", "workload.rate=8"]
    small_pool = run(compose_config([*tight, "system.preemption_mode=swap", "swap_space_gb=0.02"]))
    assert 0 < small_pool["num_swap_fallbacks"] < small_pool["num_preemptions"]
    big_pool = run(compose_config([*tight, "system.preemption_mode=swap"]))
    assert big_pool["num_preemptions"] > 0 and big_pool["num_swap_fallbacks"] == 0
    recompute = run(compose_config(tight))
    assert recompute["num_preemptions"] > 0 and recompute["num_swap_fallbacks"] == 0


def test_a_run_of_several_replicas_writes_whose_step_each_row_is(tmp_path):
    run(compose_config([*SMALL, "num_replicas=2"]), tmp_path)
    steps = pd.read_csv(tmp_path / "steps.csv")
    assert list(steps.columns[:2]) == ["step", "replica"]
    assert set(steps["replica"]) == {0, 1}
    assert not steps.duplicated(["replica", "step"]).any()


def test_same_seed_same_metrics_different_seed_differs():
    def key_metrics(seed):
        m = run(compose_config([*SMALL, f"seed={seed}"]))
        return {k: v for k, v in m.items() if k not in ("wall_s", "sim_steps_per_s")}

    assert key_metrics(3) == key_metrics(3)
    assert key_metrics(3) != key_metrics(4)


@pytest.mark.slow
def test_hydra_sweep_writes_summary(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable, "-m", "experiments.simulate", "-m", "system=vllm,orca_max",
        *SMALL, f"hydra.sweep.dir={sweep}", f"index={tmp_path / 'index.csv'}",
    ]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=300)
    summary = pd.read_csv(sweep / "summary.csv")
    assert sorted(summary["system"]) == ["orca_max", "vllm"]
    overrides = ["index", "system", "workload.duration_s", "workload.num_requests"]
    overrides.append("workload.rate")
    assert sorted(summary.columns[1:6]) == overrides  # the overrides first, then headlines
    assert list(summary.columns[6:9]) == ["completed", "num_requests", "rejected"]
    assert (summary["completed"] == 60).all()


@pytest.mark.traces
def test_azure_trace_runs():
    path = TRACES / "AzureLLMInferenceTrace_conv.csv"
    if not path.exists():
        pytest.skip("Azure traces not present")
    m = run(compose_config(["workload=azure_conv", f"workload.path={path}",
                            "workload.num_requests=150"]))  # fmt: skip
    assert m["completed"] + m["rejected"] == 150


@pytest.mark.slow
def test_a_failed_sweep_job_does_not_stop_the_sweep(tmp_path):
    """A job with a bad value is listed in summary.csv with its error, the jobs after it
    run, the process exits 2 (every failure a config error); a rerun whose job config
    changed does not keep the old result (a stale metrics.json would read as the new
    config's)."""
    sweep = tmp_path / "sweep"
    base = [sys.executable, "-m", "experiments.simulate", "-m", *SMALL,
            f"hydra.sweep.dir={sweep}", f"index={tmp_path / 'index.csv'}"]  # fmt: skip
    proc = subprocess.run([*base, "workload.rate=4,-1,2"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "job 1: error: workload.rate: not a positive rate" in proc.stderr
    summary = pd.read_csv(sweep / "summary.csv")
    assert list(summary["status"]) == ["ok", "config error", "ok"]
    assert summary["error"][1].startswith("error: workload.rate:")
    proc = subprocess.run([*base, "workload.rate=-1,-1,2"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2
    assert not (sweep / "0" / "metrics.json").exists()  # job 0's old result is gone
    summary = pd.read_csv(sweep / "summary.csv")
    assert list(summary["status"]) == ["config error", "config error", "ok"]
    # counts stay whole numbers beside the failed rows (they were written 60.0)
    assert pd.read_csv(sweep / "summary.csv", dtype=str)["completed"][2] == "60"
    # a narrower sweep into the same folder summarises its own job, not the others left
    proc = subprocess.run([*base, "workload.rate=3"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = pd.read_csv(sweep / "summary.csv")
    assert list(summary["job"]) == [0] and list(summary["workload.rate"]) == [3.0]


def test_an_azure_row_over_max_model_len_is_rejected_not_dropped(tmp_path):
    """By default every row of a real trace is a request: one longer than max_model_len is
    rejected with its reason; with apply_filter it is dropped before the run, and logged."""
    path = tmp_path / "azure.csv"
    rows = [(0.0, 100, 20), (0.5, 5000, 20), (1.0, 300, 40), (1.5, 50, 10)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{t:09.6f},{p},{o}\n" for t, p, o in rows))  # fmt: skip
    m = run(compose_config(["workload=azure_conv", f"workload.path={path}"]))
    assert (m["num_requests"], m["completed"], m["rejected_max_model_len"]) == (4, 3, 1)
    m = run(compose_config(["workload=azure_conv", f"workload.path={path}",
                            "workload.apply_filter=true"]))  # fmt: skip
    assert (m["num_requests"], m["completed"]) == (3, 3)


@pytest.mark.slow
def test_reproduce_writes_figures_and_report(tmp_path):
    from experiments.reproduce import main

    args = ["--duration", "40", "--skip-fig12", "--skip-sharing", "--workers", "1"]
    main([*args, "--out", str(tmp_path)])
    for name in ("report.md", "fig2_breakdown.csv", "fig2_breakdown.png", "fig2_breakdown.pdf",
                 "fig13_batch.csv", "fig13_batch.png", "table1.csv",
                 "vllm_overhead_sensitivity.csv"):  # fmt: skip
        assert (tmp_path / name).exists(), name
    report = (tmp_path / "report.md").read_text()
    assert "Fig. 2" in report
    # Each Fig. 13 row: kvlab's mean batch from its run, the paper's, and their ratio.
    rows = _md_table_rows(report, "## Fig. 13")
    assert [r[0] for r in rows] == [SYSTEM_LABELS[s] for s in FIG2_SYSTEMS]
    csv = pd.read_csv(tmp_path / "fig13_batch.csv")
    assert list(csv["workload"].unique()) == ["sharegpt", "alpaca"]
    alpaca = csv[csv["workload"] == "alpaca"].set_index("system")
    assert alpaca["paper_mean_batch"].isna().all()  # not in the reference facts: none shown
    for system in FIG2_SYSTEMS:
        run = json.loads(
            (tmp_path / "runs" / f"fig13_alpaca_{system}" / "metrics.json").read_text()
        )
        assert alpaca.loc[system, "kvlab_mean_batch"] == pytest.approx(run["mean_batch_size"])
    assert "### (b) Alpaca, 30 req/s" in report and "not in kvlab's reference facts" in report
    csv = csv[csv["workload"] == "sharegpt"].set_index("system")
    for system, row in zip(FIG2_SYSTEMS, rows, strict=True):
        metrics = json.loads((tmp_path / "runs" / f"fig2_{system}" / "metrics.json").read_text())
        kvlab, paper = metrics["mean_batch_size"], FIG13_BATCH[system]
        assert kvlab > 0
        assert row[1:] == [f"{kvlab:.2f}", f"{paper:.2f}", f"{kvlab / paper:.2f}"], system
        assert csv.loc[system, "kvlab_mean_batch"] == pytest.approx(kvlab)


def _md_table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the first markdown table after ``heading`` (header row excluded)."""
    lines = text[text.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip("|").split("|")])
    return table


def test_the_bare_roofline_says_what_it_leaves_out(caplog) -> None:
    # a block-size sweep on it moves memory only: the log says so, and how to add the rest
    small = ["workload.num_requests=3"]
    with caplog.at_level("INFO", logger="experiments.simulate"):
        run(compose_config(small))
    assert "no per-block cost in paged attention" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="experiments.simulate"):
        run(compose_config([*small, "cost.stack=vllm-2023"]))
    assert "no per-block cost" not in caplog.text


def test_a_profile_priced_on_another_gpu_says_so(caplog) -> None:
    # the shipped profile is an A100's: on an L40S its operators are scaled, not measured
    small = ["workload.num_requests=3", "cost=profiled"]
    with caplog.at_level("INFO", logger="experiments.simulate"):
        run(compose_config([*small, "hardware=l40s"]))
    assert "profiled prices l40s with operators measured on a100-80gb" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="experiments.simulate"):
        run(compose_config([*small, "hardware=a100-80gb"]))  # the profile's own GPU
    assert "operators measured on" not in caplog.text


def test_cost_profiled_prices_each_system_in_its_own_stack() -> None:
    # today's vLLM runs with CUDA graphs and async scheduling, the paper's systems on the
    # 2023 eager stack; a given cost.stack wins
    from experiments.lib.setup import build_setup

    def stack(*over: str) -> str:
        setup = build_setup(compose_config(["cost=profiled", "workload.num_requests=2", *over]))
        return setup.cost_model.config()["stack"]

    assert stack("system=vllm") == stack("system=orca_max") == "vllm-2023"
    assert stack("system=vllm_v1") == "vllm-v1"
    assert stack("system=vllm_v1", "cost.stack=vllm-2023") == "vllm-2023"
