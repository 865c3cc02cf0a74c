"""What a researcher reads from ``experiments.capacity`` (its printed table, ``capacity.csv``,
its one-line errors) and from the benchmark helpers ``experiments.bench.tables``,
``experiments.bench.sim`` and ``experiments.bench.timing`` (printed numbers, written rows,
the CPU timing loop): behaviours the earlier tests left unchecked."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
import torch

from experiments import capacity
from experiments.bench import sim, tables, timing
from experiments.lib.checks import ConfigError

# --- capacity: the table and capacity.csv ----------------------------------------------


def _runs(system: str, passes: dict[float, tuple[bool, ...]], **metrics: Any) -> list[dict]:
    """Synthetic search rows: per rate, one run per seed passing as given; ``metrics`` the
    same on every run unless a tuple (one value per seed)."""
    rows = []
    for rate, oks in passes.items():
        for seed, ok in enumerate(oks):
            m = {k: (v[seed] if isinstance(v, tuple) else v) for k, v in metrics.items()}
            rows.append({"setting": "search", "system": system, "rate": rate, "seed": seed,
                         "passes": ok, "fails_on": "" if ok else "latency",
                         "normalized_latency": 0.2 if ok else 3.0, **m})  # fmt: skip
    return rows


VLLM = _runs(
    "vllm", {1.25: (True, True), 2.5: (True, False)},
    output_throughput=(100.4, 146.0), request_throughput=1.0, mean_ttft_ms=(45.6, 46.6),
    mean_tpot_ms=12.3, mean_batch_size=7.5, p99_ttft_ms=80.0,
)  # fmt: skip
ORCA_MAX = _runs("orca_max", {1.0: (True, True), 2.0: (True, True)}, output_throughput=200.0,
                 request_throughput=2.0, mean_ttft_ms=30.0, mean_tpot_ms=10.0,
                 mean_batch_size=4.0)  # fmt: skip
ORCA_POW2 = _runs("orca_pow2", {1.0: (False, False)}, output_throughput=50.0)
SYSTEMS = ["vllm", "orca_max", "orca_pow2"]


def test_the_printed_table_states_each_rate_bound_and_metric() -> None:
    """Rates to 3 significant digits (``>=`` a floor, ``<`` nothing passed), the ratio to
    the first system to 2 decimals (``(bound)`` over an open rate, ``<`` under a rate that
    failed), then output tok/s, TTFT and TPOT ms and the batch at the rate, each in its
    column under its heading; "fails at": the lowest failing rate and the rules failed
    there (the heading's lines name each rule)."""
    cap = capacity.capacity_frame(VLLM + ORCA_MAX + ORCA_POW2, SYSTEMS)
    lines = capacity.print_table(cap, 0.5).splitlines()
    assert lines[1] == "  latency: normalized latency <= 0.5 s/token"
    lines = lines[4:]  # the heading and its three rules
    assert lines[0].split() == ["system", "req/s", "seed", "range", "fails", "at", "over_vllm",
                                "tok/s", "out", "TTFT", "ms", "TPOT", "ms", "batch"]  # fmt: skip
    assert lines[1].split() == ["vllm", "1.25", "1.25–2.5", "2.5", "latency", "1.00x", "123",
                                "46", "12.3", "7.5"]  # fmt: skip
    assert lines[2].split() == ["orca_max", ">=2", ">=2–2", "—", "1.60x", "(bound)", "200", "30",
                                "10.0", "4.0"]  # fmt: skip
    assert lines[3].split() == ["orca_pow2", "<1", "—", "1", "latency", "<0.80x", "nan", "nan",
                                "nan", "nan"]  # fmt: skip
    assert len({len(line) for line in lines}) == 1  # one column layout


def test_capacity_csv_columns_order_and_bounds() -> None:
    """``capacity.csv``: rows in ``systems``' order (not the runs'), no ``setting`` nor the
    report's vLLM-ratio columns, every metric of the runs at the rate; a ratio to an open
    rate is a bound, and no ratio is made over a reference that passed nothing."""
    cap = capacity.capacity_frame(VLLM + ORCA_MAX + ORCA_POW2, ["orca_pow2", "vllm", "orca_max"])
    assert list(cap["system"]) == ["orca_pow2", "vllm", "orca_max"]
    assert not [c for c in cap.columns if c == "setting" or c.startswith(("vllm_", "ratio_"))]
    at_rate = [c.removesuffix("_at_rate") for c in cap.columns if c.endswith("_at_rate")]
    assert at_rate == [
        "offered_rate", "request_throughput", "output_throughput", "normalized_latency",
        "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_e2el_ms",
        "mean_batch_size", "num_preemptions",
        "kv_token_states_pct", "kv_reserved_pct", "kv_internal_frag_pct",
        "kv_external_frag_pct", "kv_free_at_limit_pct", "kv_free_pct", "num_requests",
        "slo_attainment",
    ]  # fmt: skip
    row = cap.set_index("system").loc["vllm"]
    assert row["p99_ttft_ms_at_rate"] == 80.0 and row["mean_ttft_ms_at_rate"] == 46.1
    assert math.isnan(row["mean_e2el_ms_at_rate"])  # not measured: not a zero
    # the reference passed nothing: no ratio, and every row is only a bound
    assert cap["over_orca_pow2"].isna().all()
    assert set(cap["over_orca_pow2_bound"]) == {"bound"}
    # an exact reference: an exact rate is exact, an open one a bound
    cap = capacity.capacity_frame(VLLM + ORCA_MAX, ["vllm", "orca_max"]).set_index("system")
    assert cap.loc["vllm", "over_vllm_bound"] == "exact"
    assert cap.loc["orca_max", "over_vllm_bound"] == "bound"


def test_written_outputs_hold_the_threshold_and_the_runs(tmp_path: Path, capsys) -> None:
    """``write_outputs``: ``capacity.csv`` states the threshold it was searched at,
    ``runs.csv`` every run (no ``setting`` column), ``curves.csv`` one row per system and
    rate; the setting heads what is printed."""
    rows = [{**r, "label": f"{r['system']}_{r['rate']}_{r['seed']}"} for r in VLLM + ORCA_MAX]
    capacity.write_outputs(rows, ["vllm", "orca_max"], 0.5, tmp_path, "my setting")
    assert capsys.readouterr().out.splitlines()[0] == "my setting"
    cap = pd.read_csv(tmp_path / "capacity.csv")
    assert set(cap["threshold"]) == {0.5}
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert len(runs) == len(rows) and "setting" not in runs.columns
    curves = pd.read_csv(tmp_path / "curves.csv")
    assert len(curves) == 4 and "normalized_latency_mean" in curves.columns
    assert "setting" not in curves.columns


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--rates", "0,1"], "error: --rates: rates must be numbers > 0"),
        (["--rates", "1,inf"], "error: --rates: rates must be numbers > 0"),
        (["--rates", "1,1,2"], "error: --rates: rates must ascend without repeats"),
        (["--rate-tol", "1"], "error: --rate-tol: not a number in (0, 1)"),
        (["--rate-tol", "0"], "error: --rate-tol: not a number in (0, 1)"),
        (["--bisect-evals", "0"], "error: --bisect-evals: not a count >= 1"),
        (["--threshold", "nan"], "error: --threshold: not a number > 0"),
        (["--out", "{file}"], "error: --out: {file} is a file, not a folder"),
        (["++workload.rate=3"], "error: workload.rate: set by the search: leave it out"),
        (["workload.durationn_s=5"], "error: workload.durationn_s"),  # a typo of a key
        (  # spaces around a name are not part of it
            ["--systems", "vllm, orca_max", "workload=vllm_log", "workload.path=run"],
            "error: workload: kind 'vllm_log' replays logged arrivals",
        ),
    ],
)
def test_capacity_refuses_bad_flags_in_one_line(
    args: list[str], line: str, tmp_path: Path, capsys
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = [a.format(file=blocker) for a in args]
    with pytest.raises(SystemExit) as ended:
        capacity.main([*argv, "--out", str(tmp_path / "out")] if "--out" not in args else argv)
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(line.format(file=blocker)), err
    assert not (tmp_path / "out").exists()


def test_a_search_runs_at_the_given_seed_and_threshold(tmp_path: Path) -> None:
    """``--seed`` is the seed run; ``--threshold`` is the one every run is judged by and
    the one ``capacity.csv`` states (a threshold nothing meets: no rate passes)."""
    args = ["workload.duration_s=20", "--systems", "vllm", "--rates", "1,2", "--seeds", "1",
            "--seed", "3", "--threshold", "1e-6", "--bisect-evals", "1",
            "--workers", "1"]  # fmt: skip
    out = capacity.main([*args, "--out", str(tmp_path / "out")])
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs["seed"]) == {3} and not runs["passes"].any()
    cap = pd.read_csv(out / "capacity.csv")
    assert cap.loc[0, "max_rate"] == 0 and cap.loc[0, "threshold"] == 1e-6


def _trace_plan(
    workload: dict[str, Any], arrivals: list[float], tmp_path: Path,
    in_file: list[float] | None = None,
) -> capacity.Plan:  # fmt: skip
    """:func:`capacity._plan` of a Vidur trace file of ``in_file`` arrivals (default
    ``arrivals``) whose window with ``workload``'s keys holds ``arrivals``."""
    from omegaconf import OmegaConf

    from core.request import Request

    trace = tmp_path / "trace.csv"
    rows = [f"{t},10,10" for t in (arrivals if in_file is None else in_file)]
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows))
    cfg = OmegaConf.create(
        {"workload": {"kind": "vidur", "path": str(trace), "apply_filter": False, **workload},
         "cost": {"kind": "roofline"}}
    )  # fmt: skip
    setup = SimpleNamespace(
        cost_model=None, model=SimpleNamespace(name="m"), tp=1, gpu=SimpleNamespace(name="g"),
        requests=[Request(i, t, 10, 10) for i, t in enumerate(arrivals)], max_model_len=2048,
    )  # fmt: skip
    return capacity._plan(cfg, setup)


def test_a_trace_plan_states_its_window_and_rate(tmp_path: Path) -> None:
    """A window that cuts the trace rates its requests over the window; one that runs past
    the trace's last arrival cuts nothing, and the trace is rated over its span, as with
    neither key (not over the window's empty tail). A time_scale a config group set (below
    1 as above it) is the search's: refused."""
    ten = [float(i) for i in range(10)]  # last at 9 s
    plan = _trace_plan({"duration_s": 5, "num_requests": 50, "time_scale": 1.0}, ten[:5],
                       tmp_path, in_file=ten)  # fmt: skip
    assert (plan.trace_rate, plan.window) == (1.0, 5.0)
    assert "the trace (its first 5 requests) runs at 1 req/s" in plan.setting
    plan = _trace_plan({"duration_s": 20, "num_requests": 50, "time_scale": 1.0}, ten, tmp_path)
    assert plan.trace_rate == pytest.approx(10 / 9) and plan.window == 20.0
    assert "the trace (all 10 requests) runs at 1.11 req/s" in plan.setting
    plan = _trace_plan({"duration_s": None, "num_requests": None, "time_scale": 1.0}, ten,
                       tmp_path)  # fmt: skip
    assert plan.trace_rate == pytest.approx(10 / 9) and plan.window is None
    assert "the trace (all 10 requests) runs at 1.11 req/s" in plan.setting
    with pytest.raises(ConfigError, match=r"set by the search"):
        _trace_plan({"duration_s": None, "num_requests": None, "time_scale": 0.5}, ten, tmp_path)


def test_a_trace_whose_arrivals_have_no_span_is_a_config_error() -> None:
    from core.request import Request

    reqs = [Request(i, 0.0, 10, 10) for i in range(3)]  # all at 0: no rate to scale
    with pytest.raises(ConfigError, match=r"holds no span of arrivals"):
        capacity.trace_rate(reqs, None, counted=False)


def test_only_capacity_runs_are_cleared_from_runs(tmp_path: Path) -> None:
    """A folder of the user's beside the runs is kept, even one holding a metrics.json."""
    theirs = tmp_path / "runs" / "baseline"
    theirs.mkdir(parents=True)
    (theirs / "metrics.json").write_text("{}")
    assert capacity.clear_earlier_runs(tmp_path / "runs") == 0 and theirs.is_dir()


def test_each_search_is_the_documented_one() -> None:
    """Grown up to 64x the grid's top, at most 10% backlog, stopped at the first failing
    rate, bisected with the flags' steps and tolerance, one per system in order."""
    plan = capacity.Plan("s")
    found = capacity.searches(["model=opt-13b"], ["vllm", "orca_max"], (1.0, 2.0), (0, 1), 5,
                              0.02, plan)  # fmt: skip
    assert [s.system for s in found] == ["vllm", "orca_max"]
    s = found[0]
    assert (s.grow_to, s.max_backlog, s.stop_after) == (64.0, 0.1, 1)
    assert (s.bisect_evals, s.rate_tol, s.seeds, s.rates) == (5, 0.02, (0, 1), (1.0, 2.0))
    assert s.fixed == ("model=opt-13b", "system=vllm") and s.rate_overrides is None


# --- bench.tables ----------------------------------------------------------------------


def test_a_printed_table_rounds_floats_only_and_aligns_under_long_headings(capsys) -> None:
    """A float to 4 significant digits, an int in full, right-aligned under a heading
    wider than its cells; no rows: ``(no rows)``."""
    tables.print_table("t", [{"long_heading": 1.23456789, "n": 123456}])
    tables.print_table("empty", [])
    assert capsys.readouterr().out.splitlines() == [
        "", "== t ==", "long_heading       n", "       1.235  123456", "", "== empty ==",
        "(no rows)",
    ]  # fmt: skip


# --- bench.timing: the CPU branch --------------------------------------------------------


def test_cpu_timing_is_the_median_ms_of_the_given_clock_after_an_untimed_flush(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Per repeat: the cache flush, then the call between two reads of ``cpu_clock``; the
    result is the median of the repeats in milliseconds."""
    log: list[str] = []
    ticks = iter([0.0, 0.001, 1.0, 1.010, 2.0, 2.002])

    def clock() -> float:
        log.append("clock")
        return next(ticks)

    class Buffer:
        def fill_(self, value: int) -> None:
            log.append("flush")

    monkeypatch.setattr(timing, "_cpu_flush_buffer", lambda n: Buffer())
    ms = timing.time_ms(lambda: log.append("fn"), torch.device("cpu"), 3, 1, 64, cpu_clock=clock)
    assert ms == pytest.approx(2.0)
    assert log == ["fn", *["flush", "clock", "fn", "clock"] * 3]
    log.clear()
    ticks = iter([0.0, 0.004])
    assert timing.time_ms(lambda: log.append("fn"), torch.device("cpu"), 1, 0, cpu_clock=clock) == (
        pytest.approx(4.0)
    )
    assert log == ["clock", "fn", "clock"]  # no flush asked: none made


def test_the_cpu_flush_buffer_is_one_buffer_of_the_size_asked() -> None:
    buf = timing._cpu_flush_buffer(4096)
    assert buf.numel() == 4096 and buf.dtype == torch.uint8
    assert timing._cpu_flush_buffer(4096) is buf


# --- bench.sim ---------------------------------------------------------------------------


def test_a_rows_rates_are_per_wall_second_and_speeds_per_wall_and_cpu_second() -> None:
    row = sim._row("vllm", "roofline", "loop", 10, 20.0, 40, 2.0, 4.0, 0.5)
    assert (row["sim_req_per_s"], row["steps_per_s"]) == (5.0, 20.0)
    assert (row["speed_vs_real"], row["speed_vs_real_cpu"]) == (10.0, 5.0)
    assert row["price_cpu_s"] == 0.5


def test_a_configurations_row_is_the_median_of_its_runs() -> None:
    """Median wall, CPU and pricing seconds (each its own), rates recomputed from them."""
    runs = [
        sim._row("vllm", "roofline", "loop", 10, 20.0, 40, wall, cpu, price)
        for wall, cpu, price in [(1.0, 8.0, 0.3), (4.0, 2.0, 0.1), (2.0, 3.0, 0.2)]
    ]
    row = sim._median_row(runs)
    assert (row["wall_s"], row["cpu_s"], row["price_cpu_s"]) == (2.0, 3.0, 0.2)
    assert row["sim_req_per_s"] == 5.0 and row["speed_vs_real_cpu"] == 20.0 / 3.0


def test_the_benchmark_run_is_the_setup_asked() -> None:
    args = sim.overrides("orca_max", 5.0, 3.0, 7, "roofline")
    assert {"workload.duration_s=5.0", "workload.rate=3.0", "seed=7", "system=orca_max"} <= set(
        args
    )


def test_pricing_cpu_prices_every_step_once() -> None:
    priced: list[Any] = []

    class Clock:
        def step_time(self, shape: Any) -> float:
            priced.append(shape)
            return 0.0

    from core.metrics.recorder import STEP_COLUMNS

    rows = [tuple(i for _ in STEP_COLUMNS) for i in range(5)]
    assert sim.price_cpu(Clock(), rows) >= 0.0
    assert [s.decode_seqs for s in priced] == [0, 1, 2, 3, 4]


def test_a_loop_row_states_its_pricing_share() -> None:
    """``loop`` rows carry the CPU seconds of pricing every step (``price_cpu_s``)."""
    row = sim.bench_loop("vllm", 3.0, 2.0, 0, "roofline")
    assert row["mode"] == "loop" and row["requests"] == sim.workload_size(3.0, 2.0, 0)
    assert row["price_cpu_s"] is not None and row["price_cpu_s"] >= 0.0


def test_counting_the_workload_leaves_the_setup_log_level_as_it_was() -> None:
    import logging

    setup_log = logging.getLogger("experiments.lib.setup")
    before = setup_log.level
    setup_log.setLevel(logging.INFO)
    try:
        assert sim.workload_size(5.0, 2.0, 0) > 0
        assert setup_log.level == logging.INFO
    finally:
        setup_log.setLevel(before)


def _fake_simulate_run(returncode: int, stderr: str = "", stdout: str = "") -> Any:
    """A stand-in for ``subprocess.run`` of ``experiments.simulate``: writes the run's
    ``metrics.json`` and ``steps.csv`` (last step 7.5 s + 0.25 s) into its run dir."""
    seen: list[list[str]] = []

    def run(cmd: list[str], **_: Any) -> Any:
        import subprocess

        seen.append(cmd)
        run_dir = Path(next(a for a in cmd if a.startswith("hydra.run.dir=")).partition("=")[2])
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.json").write_text(json.dumps({"num_requests": 12, "num_steps": 3}))
        (run_dir / "steps.csv").write_text("step,start_s,duration_s\n0,0.0,1.0\n2,7.5,0.25\n")
        return subprocess.CompletedProcess(cmd, returncode, stdout, stderr)

    run.seen = seen  # type: ignore[attr-defined]
    return run


def test_a_whole_run_is_timed_unlisted_to_its_last_steps_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child is told to list nothing in the results index (a timing run), and its
    simulated span runs to the end of its last step."""
    fake = _fake_simulate_run(0)
    monkeypatch.setattr(sim.subprocess, "run", fake)
    monkeypatch.setattr(sim, "_children_cpu", iter([1.0, 1.5]).__next__)  # the child's CPU
    row = sim.bench_e2e("vllm", 5.0, 2.0, 0, "roofline")
    assert "index=null" in fake.seen[0]
    assert (row["mode"], row["requests"], row["steps"], row["sim_s"]) == ("e2e", 12, 3, 7.75)
    assert row["cpu_s"] == 0.5


def test_a_whole_run_that_fails_is_one_line_with_its_last_error_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A child that exits non-zero fails the benchmark even where it wrote metrics, naming
    the last line of its stderr."""
    monkeypatch.setattr(
        sim.subprocess, "run", _fake_simulate_run(1, stderr="warn\nValueError: boom\n", stdout="x")
    )
    with pytest.raises(SystemExit, match=r"failed: ValueError: boom$"):
        sim.bench_e2e("vllm", 5.0, 2.0, 0, "roofline")


def test_bench_sim_alternates_configurations_and_writes_what_it_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Every configuration once, then again (``--repeat``); rows clock-major in the order
    given; the table printed to 2 decimals; ``bench_sim.csv`` the table's columns alone
    (no index); ``bench_sim.json`` the setup asked, the median rows and every run."""
    calls: list[tuple[str, str, str]] = []
    walls = iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])

    def fake(mode: str) -> Any:
        def bench(system: str, duration: float, rate: float, seed: int, cost: str) -> dict:
            calls.append((cost, system, mode))
            return sim._row(system, cost, mode, 4, 10.0, 20, next(walls), 1.0, None)

        return bench

    monkeypatch.setattr(sim, "bench_loop", fake("loop"))
    monkeypatch.setattr(sim, "bench_e2e", fake("e2e"))
    table = sim.main(["--duration", "3", "--rate", "1.5", "--seed", "2", "--systems", "vllm",
                      "orca_max", "--modes", "loop", "--cost", "roofline", "paper-a100",
                      "--repeat", "2", "--out", str(tmp_path)])  # fmt: skip
    configs = [("roofline", "vllm", "loop"), ("roofline", "orca_max", "loop"),
               ("paper-a100", "vllm", "loop"), ("paper-a100", "orca_max", "loop")]  # fmt: skip
    assert calls == configs * 2
    assert list(zip(table["cost"], table["system"], table["mode"], strict=True)) == configs
    assert list(table["wall_s"]) == [3.0, 4.0, 5.0, 6.0]  # median of runs i and i + 4
    out = capsys.readouterr().out
    assert "vllm roofline loop (run 1/2): 1.00 s wall, 1.00 s CPU" in out.splitlines()
    assert "2.50" in out and "2.500" not in out  # vllm roofline's speed_vs_real, 10 / 4
    written = pd.read_csv(tmp_path / "bench_sim.csv")
    assert list(written.columns) == list(sim.COLUMNS)
    doc = json.loads((tmp_path / "bench_sim.json").read_text())
    setup = doc["setup"]
    assert (setup["duration_s"], setup["rate"], setup["seed"]) == (3.0, 1.5, 2)
    assert setup["cost"] == ["roofline", "paper-a100"] and setup["repeat"] == 2
    assert [r["wall_s"] for r in doc["rows"]] == [3.0, 4.0, 5.0, 6.0]
    assert [r["wall_s"] for r in doc["runs"]] == [1.0, 5.0, 2.0, 6.0, 3.0, 7.0, 4.0, 8.0]
    assert len(doc["machine"]["load_avg_1_5_15min"]) == 3


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--duration", "0"], "--duration and --rate must be finite and > 0"),
        (["--rate", "inf"], "--duration and --rate must be finite and > 0"),
        (["--repeat", "0"], "--repeat must be >= 1"),
    ],
)
def test_bench_sim_refuses_a_bad_number_in_one_line(
    args: list[str], phrase: str, tmp_path: Path, capsys
) -> None:
    with pytest.raises(SystemExit) as ended:
        sim.main(["--systems", "vllm", "--modes", "loop", *args, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert ended.value.code == 2 and phrase in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()
