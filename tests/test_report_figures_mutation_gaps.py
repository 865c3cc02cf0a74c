"""Gaps a mutation audit of the report's figures, clock, selection, Fig. 2 spread study,
sweep plot and reproduce found: what a reader of each figure, CSV or log line would see."""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from experiments.report import clock, figures, selection
from experiments.report.paper import FIG2_BREAKDOWN, FIG13_BATCH
from tests.test_report_clock import block_study_runs

plt = figures.pyplot(headless=True)


@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    yield
    plt.close("all")


def _texts(ax: Any) -> list[str]:
    return [t.get_text() for t in ax.texts]


# --- figures.py ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "flag"),
    [(True, True), ("True", True), (1, True), ("1", True), (1.0, True), (False, False),
     (math.nan, False), ("", False)],
)  # fmt: skip
def test_is_flag_reads_a_csvs_true_one_and_one_point_zero(value: Any, flag: bool) -> None:
    assert figures.is_flag({"rate_open": value}, "rate_open") is flag
    assert figures.is_flag({}, "rate_open") is False


def test_rate_bound_marks_name_what_a_bar_cannot_say() -> None:
    """A system that passed no rate: "<r" (r its first failing rate), or "none"; a lower
    bound "≥" (also when its top is open too); an open top alone "↑"; else nothing."""
    rows = [
        {"max_rate": 0.0, "first_failing_rate": 0.5},
        {"max_rate": 0.0},
        {"max_rate": 2.0, "rate_hi": 3.0, "rate_open": True, "rate_hi_open": True},
        {"max_rate": 2.0, "rate_hi": 3.0, "rate_open": False, "rate_hi_open": "True"},
        {"max_rate": 2.0, "rate_hi": 3.0, "rate_open": False, "rate_hi_open": False},
    ]
    _, ax = plt.subplots()
    figures.mark_rate_bounds(ax, range(len(rows)), rows)
    assert _texts(ax) == ["<0.5", "none", "≥", "↑"]
    assert [t.xy for t in ax.texts[2:]] == [(2, 3.0), (3, 3.0)]  # above the interval's top


def test_rate_bars_draw_the_seed_interval_as_error_bars() -> None:
    _, ax = plt.subplots()
    rows = [{"max_rate": 2.0, "rate_lo": 1.5, "rate_hi": 3.0}, {"max_rate": 4.0}]
    figures.rate_bars(ax, [0.0, 1.0], rows, 0.4, label="vLLM")
    assert [p.get_height() for p in ax.patches] == [2.0, 4.0]
    (bars,) = [c for c in ax.containers if hasattr(c, "errorbar")]
    segments = bars.errorbar.lines[2][0].get_segments()
    assert [(s[0][1], s[1][1]) for s in segments] == [(1.5, 3.0), (4.0, 4.0)]


def test_rate_bars_draw_no_bar_on_a_side_whose_end_is_missing() -> None:
    # a NaN end had been read as 0: a negative error bar, which matplotlib refuses
    _, ax = plt.subplots()
    rows = [{"max_rate": 2.0, "rate_lo": math.nan, "rate_hi": 3.0},
            {"max_rate": 4.0, "rate_lo": 3.5, "rate_hi": math.nan}]  # fmt: skip
    figures.rate_bars(ax, [0.0, 1.0], rows, 0.4, label="vLLM")
    (bars,) = [c for c in ax.containers if hasattr(c, "errorbar")]
    segments = bars.errorbar.lines[2][0].get_segments()
    assert [(s[0][1], s[1][1]) for s in segments] == [(2.0, 3.0), (3.5, 4.0)]


def _fig2_table() -> pd.DataFrame:
    from experiments.report.markdown import fig2_table

    runs = pd.DataFrame([
        {"system": "orca_max", "kv_token_states_pct": 20.0, "kv_reserved_pct": 10.0,
         "kv_internal_frag_pct": 50.0, "kv_external_frag_pct": 10.0,
         "kv_free_at_limit_pct": 4.0, "kv_free_pct": 6.0},
        {"system": "vllm", "kv_token_states_pct": 90.0, "kv_reserved_pct": 0.0,
         "kv_internal_frag_pct": 2.0, "kv_external_frag_pct": 1.0,
         "kv_free_at_limit_pct": 3.0, "kv_free_pct": 4.0},
    ])  # fmt: skip
    return fig2_table(runs)


def test_fig2_stacks_kvlabs_bar_before_the_papers_per_system() -> None:
    """Bars alternate kvlab, paper per system; each part sits on the parts before it; a
    part the paper shows no bar for (None) has height 0; labels name each part."""
    fig = figures.fig2_breakdown(_fig2_table())
    ax = fig.axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["Orca (Max)\nkvlab", "Orca (Max)\npaper", "vLLM\nkvlab", "vLLM\npaper"]
    n = len(ticks)
    heights = [p.get_height() for p in ax.patches]
    bottoms = [p.get_y() for p in ax.patches]
    by_part = {part: heights[i * n : (i + 1) * n] for i, part in enumerate(figures.KV_PARTS)}
    paper = FIG2_BREAKDOWN
    assert by_part["token_states"] == [20.0, paper["orca_max"]["token_states"], 90.0,
                                       paper["vllm"]["token_states"]]  # fmt: skip
    assert by_part["reserved"][3] == 0.0  # the paper shows no reservation for vLLM
    assert by_part["free"] == [6.0, 0.0, 4.0, 0.0]
    # the second part starts on top of the first, the last on top of all five before it
    assert bottoms[n : 2 * n] == by_part["token_states"]
    assert bottoms[5 * n] == pytest.approx(20.0 + 10.0 + 50.0 + 10.0 + 4.0)
    labels = ax.get_legend_handles_labels()[1]
    assert labels == [figures.PART_LABELS[p] for p in figures.KV_PARTS]
    assert figures.PART_LABELS["free"] == "Free (nobody waiting)"
    assert figures.PART_LABELS["free_at_limit"] == "Free (waiting on a scheduler limit)"


def _fig13() -> pd.DataFrame:
    from experiments.report.markdown import fig13_table

    runs = pd.DataFrame({"system": ["orca_oracle", "vllm"], "mean_batch_size": [12.0, 33.0]})
    return pd.concat(
        [fig13_table(runs, "sharegpt", 2.0), fig13_table(runs, "alpaca", 30.0)],
        ignore_index=True,
    )


def test_fig13_panels_follow_the_tables_workload_order_with_their_rates() -> None:
    fig = figures.fig13_batch(_fig13())
    a, b = fig.axes
    assert a.get_title() == "Fig. 13 (a): OPT-13B, ShareGPT 2 req/s"
    assert b.get_title() == "Fig. 13 (b): OPT-13B, Alpaca 30 req/s"
    # (a): kvlab's bars then the paper's; (b): kvlab's alone and the note
    assert [p.get_height() for p in a.patches] == [12.0, 33.0, FIG13_BATCH["orca_oracle"],
                                                   FIG13_BATCH["vllm"]]  # fmt: skip
    assert [p.get_height() for p in b.patches] == [12.0, 33.0]
    assert "paper's values: not in kvlab's reference facts" in _texts(b)
    assert "12.0" in _texts(a) and "33.0" in _texts(a)  # the value on each kvlab bar


def test_fig13_draws_the_papers_bars_where_any_of_the_panel_is_known() -> None:
    """A ShareGPT panel with a system the paper has no batch for (vLLM V1) still shows the
    paper's bars for the others, not the "not in the facts" note."""
    from experiments.report.markdown import fig13_table

    runs = pd.DataFrame({"system": ["vllm", "vllm_v1"], "mean_batch_size": [30.0, 40.0]})
    ax = figures.fig13_batch(fig13_table(runs, "sharegpt", 2.0)).axes[0]
    assert ax.get_legend_handles_labels()[1] == ["kvlab", "paper (Fig. 13)"]
    assert not any("not in kvlab's" in t for t in _texts(ax))


def test_table1_marks_kvlabs_difference_from_the_paper_in_percent() -> None:
    t1 = pd.DataFrame({"model": ["OPT-13B"], "num_gpus": [1], "gpu": ["A100"],
                       "max_slots": [11000.0], "paper_slots": [10000.0]})  # fmt: skip
    ax = figures.table1_capacity(t1).axes[0]
    assert _texts(ax) == ["+10.0%"]
    assert [p.get_height() for p in ax.patches] == [11.0, 10.0]  # thousand tokens


def test_sensitivity_draws_each_clock_in_overhead_order_with_the_papers_lines() -> None:
    sens = pd.DataFrame({
        "clock": ["paper-a100", "paper-a100", "roofline", "roofline"],
        "report_clock": [True, True, False, False],
        "per_step_overhead_ms": [5.0, 0.0, 10.0, 0.0],
        "mean_batch_size": [25.0, 20.0, 18.0, 15.0],
        "normalized_latency": [0.2, 0.1, 0.3, 0.05],
        "kv_token_states_pct": [80.0, 70.0, 60.0, 50.0],
    })  # fmt: skip
    fig = figures.overhead_sensitivity(sens)
    batch, _, share = fig.axes
    own, roof, paper = batch.get_lines()
    assert list(own.get_xdata()) == [0.0, 5.0] and list(own.get_ydata()) == [20.0, 25.0]
    assert own.get_linestyle() == "-" and roof.get_linestyle() == ":"
    assert list(paper.get_ydata()) == [FIG13_BATCH["vllm"]] * 2
    assert list(share.get_lines()[-1].get_ydata()) == [FIG2_BREAKDOWN["vllm"]["token_states"]] * 2


def test_value_reads_missing_numbers_as_zero() -> None:
    assert [figures._value(v) for v in (None, math.nan, 2)] == [0.0, 0.0, 2.0]


def test_save_writes_the_png_and_the_pdf_under_the_stem(tmp_path: Path) -> None:
    fig, _ = plt.subplots()
    png = figures.save(fig, tmp_path, "fig2_breakdown")
    assert png == tmp_path / "fig2_breakdown.png"
    assert {p.name for p in tmp_path.iterdir()} == {"fig2_breakdown.png", "fig2_breakdown.pdf"}


# --- clock.py -----------------------------------------------------------------------------


def _blocks(sizes: tuple[int, ...] = (1, 16, 256), swap: bool = True) -> pd.DataFrame:
    return block_study_runs(sizes, swap, swap_factor=5.0)


def test_fig18b_draws_the_recompute_runs_only() -> None:
    """Fig. 19's swap runs (ShareGPT too) stay out of Fig. 18b's ShareGPT line."""
    ax = clock.draw_fig18b(_blocks()).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"alpaca 25 req/s", "sharegpt 2 req/s"}
    assert list(lines["sharegpt 2 req/s"].get_xdata()) == [1, 16, 256]
    assert list(lines["sharegpt 2 req/s"].get_ydata()) == [0.3, 0.1, 0.2]


def test_without_swap_runs_fig19_has_no_end_to_end_runs() -> None:
    """No swap run: Fig. 19's CSV of runs is empty and its section has no (b) table."""
    blocks = _blocks(swap=False)
    assert clock.fig19_runs(blocks).empty
    price = pd.DataFrame({"block_size": [1, 16, 256], "blocks": [512, 32, 2],
                          "swap_total_ms": [10.0, 1.0, 0.5],
                          "recompute_ms": [1.0] * 3})  # fmt: skip
    text = "\n".join(clock.fig19_section(blocks, price, "Clock: test"))
    assert "(b) End to end" not in text and "- Gap" not in text


def test_fig19_gap_line_names_the_smallest_block_size_it_priced() -> None:
    price = pd.DataFrame({"block_size": [2, 16, 256], "blocks": [256, 32, 2],
                          "swap_total_ms": [10.0, 1.0, 0.5],
                          "recompute_ms": [1.0] * 3})  # fmt: skip
    text = "\n".join(clock.fig19_section(_blocks((2, 16, 256)), price, "Clock: test"))
    assert "0.10 at block 2, 1.00 at block 16" in text and "at block 1," not in text


def test_fig18b_gap_line_without_block_256_names_no_ratio_to_it() -> None:
    text = "\n".join(clock.fig18b_section(_blocks((1, 16, 64)), "Clock: test"))
    assert "kvlab's best block size is 16" in text
    assert "Latency at block 1" not in text


class _Roofline:
    """Transfers at 1 ms a block each way; ``gpu_parts`` 2 ms linear + 1 ms attention."""

    def transfer_time(self, shape: Any) -> float:
        return 1e-3 * (shape.swap_out_blocks + shape.swap_in_blocks)

    def gpu_parts(self, shape: Any) -> tuple[float, float]:
        return 2e-3, 1e-3


class _Profiled:
    """A profile-backed model: its own ``gpu_seconds``, transfers from its ``roofline``."""

    roofline = _Roofline()

    def gpu_seconds(self, shape: Any) -> float:
        return 7e-3


def test_preemption_cost_prices_a_profiled_clock_by_its_roofline_and_its_profile() -> None:
    """The report's default clock (a profile) has no transfer time of its own and its own
    GPU seconds: the swap price is its roofline's, the recompute its profile's."""
    price = clock.preemption_cost(lambda bs: _Profiled(), (256,)).iloc[0]
    assert price["swap_total_ms"] == pytest.approx(4.0)  # 2 blocks out, 2 in
    assert price["recompute_ms"] == pytest.approx(7.0)
    assert clock.gpu_seconds(_Roofline(), None) == pytest.approx(3e-3)  # type: ignore[arg-type]


def test_the_added_time_line_leaves_out_the_run_with_no_added_time() -> None:
    sens = pd.DataFrame({"report_clock": [True, True], "per_step_overhead_ms": [0.0, 2.0],
                         "kv_token_states_pct": [80.0, 85.0],
                         "mean_batch_size": [20.0, 22.0]})  # fmt: skip
    runs = pd.DataFrame([{"system": "vllm", "kv_token_states_pct": 80.0, "kv_free_pct": 5.0,
                          "mean_batch_size": 20.0}])  # fmt: skip
    lines = clock.gap_lines(runs, ("fig2", "fig13"), sens)
    # vLLM alone: the Fig. 2 line, no Fig. 13 ratio (no Orca (Oracle) to divide by)
    assert [line[:9] for line in lines] == ["- Fig. 2:", "- Time pe"]
    assert lines[-1].endswith(
        "gives vLLM's token-state share and batch: +2 ms: 85.0%, batch 22.00."
    )


# --- selection.py -------------------------------------------------------------------------


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str, *args: Any) -> None:
        self.lines.append(msg % args)


def test_progress_logs_a_figure_done_once_all_its_jobs_succeeded() -> None:
    log = _Log()
    progress = selection.Progress(log, started=0.0)  # type: ignore[arg-type]
    jobs: list[Future[Any]] = [Future(), Future()]
    progress.runs("fig2", jobs)
    jobs[0].set_result(1)
    assert log.lines == []  # one of two done: not yet
    jobs[1].set_result(2)
    assert len(log.lines) == 1 and log.lines[0].startswith("fig2: 2 jobs done (")
    # a figure whose jobs are rate searches says so (Fig. 12 said "5 jobs" of 99 runs)
    searches: list[Future[Any]] = [Future()]
    progress.runs("fig12", searches, "rate searches")
    searches[0].set_result(0)
    assert log.lines[-1].startswith("fig12: 1 rate searches done (")


def test_a_total_registered_after_its_parts_is_logged_after_them() -> None:
    # reproduce registers Fig. 12's panels before their total: the job that ends the last
    # panel also ends the total, and the total's line came first when registered first
    log = _Log()
    progress = selection.Progress(log, started=0.0)  # type: ignore[arg-type]
    jobs: list[Future[Any]] = [Future(), Future()]
    progress.runs("fig12 (a)", jobs[:1])
    progress.runs("fig12 (f)", jobs[1:])
    progress.runs("fig12", jobs)
    jobs[0].set_result(0)
    jobs[1].set_result(0)
    assert [line.split(":")[0] for line in log.lines] == ["fig12 (a)", "fig12 (f)", "fig12"]


@pytest.mark.parametrize("spoil", ["exception", "cancel"])
def test_progress_says_nothing_done_when_a_job_failed(spoil: str) -> None:
    log = _Log()
    progress = selection.Progress(log, started=0.0)  # type: ignore[arg-type]
    jobs: list[Future[Any]] = [Future(), Future()]
    progress.runs("fig13", jobs)
    if spoil == "exception":
        jobs[0].set_exception(RuntimeError("run failed"))
    else:
        jobs[0].cancel()
    jobs[1].set_result(1)
    assert log.lines == []


def test_progress_names_the_files_written() -> None:
    log = _Log()
    selection.Progress(log, started=0.0).wrote("fig19", "a.csv", "b.csv")  # type: ignore[arg-type]
    assert log.lines[0].startswith("fig19: wrote a.csv, b.csv (")


# --- fig2_spread.py -----------------------------------------------------------------------


def test_a_spread_point_runs_fig2s_scenario_on_the_paper_era_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each grid point is Fig. 2's run (OPT-13B, A100-40GB, ShareGPT 2 req/s, the paper-era
    clock) with its own sigmas, trace length and seed; the row carries the four shares."""
    import experiments.simulate
    from experiments.report import fig2_spread

    seen: list[Any] = []

    def run(cfg: Any, out: Any) -> dict[str, float]:
        seen.append(cfg)
        return {"mean_batch_size": 9.0, **{k: float(i) for i, k in enumerate(fig2_spread.SHARES)}}

    monkeypatch.setattr(experiments.simulate, "run", run)
    row = fig2_spread.run_point("orca_max", 1.4, 0.8, duration=30.0, seed=7)
    (cfg,) = seen
    assert (cfg.workload.sigma_input, cfg.workload.sigma_output) == (1.4, 0.8)
    assert (cfg.workload.dataset, cfg.workload.rate, cfg.workload.duration_s) == (
        "sharegpt", 2.0, 30.0,
    )  # fmt: skip
    assert (cfg.cost.kind, cfg.cost.stack, cfg.seed) == ("profiled", "vllm-2023", 7)
    assert (cfg.model.name, cfg.hardware.name, cfg.system.name) == (
        "opt-13b", "a100-40gb", "orca_max",
    )  # fmt: skip
    assert row == {"system": "orca_max", "sigma_input": 1.4, "sigma_output": 0.8,
                   "mean_batch_size": 9.0, "kv_token_states_pct": 0.0, "kv_reserved_pct": 1.0,
                   "kv_internal_frag_pct": 2.0, "kv_external_frag_pct": 3.0}  # fmt: skip


def test_the_spread_summary_gives_each_shares_paper_value_or_a_dash() -> None:
    from experiments.report.fig2_spread import SHARES, SYSTEMS, summary

    rows = pd.DataFrame([
        {"system": s, "sigma_input": 1.2, "sigma_output": 1.0, **{k: 1.0 for k in SHARES}}
        for s in SYSTEMS
    ])  # fmt: skip
    lines = summary(rows).splitlines()
    assert "| Orca (Max) | reservation | 1.0 | 1.0–1.0 | 13.3 |" in lines
    assert "| Orca (Oracle) | internal frag. | 1.0 | 1.0–1.0 | — |" in lines
    assert "| vLLM | external frag. & other | 1.0 | 1.0–1.0 | 3.7 |" in lines
    assert len(lines) == 2 + len(SYSTEMS) * len(SHARES)


def test_the_spread_study_runs_fig2s_four_systems() -> None:
    from experiments.report.fig2_spread import SYSTEMS
    from experiments.reproduce import FIG2_SYSTEMS

    assert SYSTEMS == FIG2_SYSTEMS


@pytest.mark.parametrize(
    "args", [["--duration", "0"], ["--duration", "nan"], ["--seed", "-1"], ["--workers", "0"]]
)
def test_the_spread_study_refuses_numbers_a_run_cannot_use(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from experiments.report.fig2_spread import main

    with pytest.raises(SystemExit) as ended:
        main(["--out", str(tmp_path / "out"), *args])
    assert ended.value.code == 2
    assert "--duration must be > 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# --- sweep_plot.py ------------------------------------------------------------------------


def test_a_point_whose_hue_is_empty_keeps_its_runs(tmp_path: Path) -> None:
    """A run whose hue key is unset (NaN) is its own line, not dropped; a finished run with
    no value counts for nothing while its point's other runs are averaged."""
    from experiments.report import sweep_plot

    frame = pd.DataFrame({
        "system": ["vllm", None, "vllm"], "system.block_size": [8, 8, 8],
        "normalized_latency": [0.1, 0.4, None], "status": ["ok", "ok", "ok"],
    })  # fmt: skip
    table = sweep_plot.aggregate(frame, "system.block_size", "normalized_latency", "system",
                                 tmp_path / "summary.csv")  # fmt: skip
    assert len(table) == 2
    assert table["mean"].tolist() == [0.1, 0.4] and table["runs"].tolist() == [1, 1]


@pytest.mark.parametrize(
    ("values", "log2"),
    [([8, 16, 32], True), ([8, 16], False), ([0, 1, 2, 4], False), ([1.0, 2.0, 4.0], False),
     ([8, 16, 24], False)],
)  # fmt: skip
def test_only_three_positive_integer_powers_of_two_get_a_log2_axis(
    values: list[float], log2: bool
) -> None:
    from experiments.report import sweep_plot

    assert sweep_plot._powers_of_two(pd.Series(values)) is log2


def _sweep(folder: Path, statuses: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({
        "system": ["vllm", "orca_max"] * (len(statuses) // 2), "seed": range(len(statuses)),
        "request_throughput": [1.0] * len(statuses), "status": statuses,
    }).to_csv(folder / "summary.csv", index=False)  # fmt: skip
    return folder


def test_the_sweep_plot_counts_every_unfinished_run_and_labels_its_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from experiments.report import sweep_plot

    kept: dict[str, Any] = {}

    def keep(fig: Any, out: Path, name: str) -> Path:
        kept[name] = fig
        return out / f"{name}.png"

    monkeypatch.setattr(figures, "save", keep)
    sweep = _sweep(tmp_path / "sweep", ["ok", "ok", "failed", "timeout"])
    argv = [str(sweep), "--x", "seed", "--y", "request_throughput", "--hue", "system"]
    assert sweep_plot.main(argv) == 0
    assert "2 run(s) not finished" in capsys.readouterr().out
    legend = kept["sweep_request_throughput"].axes[0].get_legend()
    # the sweep's order (summary.csv's first appearance), not alphabetical
    assert [t.get_text() for t in legend.get_texts()] == ["vllm", "orca_max"]


def test_an_empty_summary_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.report import sweep_plot

    (tmp_path / "summary.csv").write_text("")
    assert sweep_plot.main([str(tmp_path), "--x", "seed", "--y", "request_throughput"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not a CSV table" in err and err.count("\n") == 1


def test_an_out_that_is_a_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from experiments.report import sweep_plot

    sweep = _sweep(tmp_path / "sweep", ["ok", "ok"])
    (tmp_path / "a-file").write_text("")
    argv = [str(sweep), "--x", "seed", "--y", "request_throughput", "--out",
            str(tmp_path / "a-file")]  # fmt: skip
    assert sweep_plot.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out ") and "a file, not a folder" in err
    assert not list(sweep.glob("sweep_*"))


# --- reproduce.py -------------------------------------------------------------------------


class _Pool:
    """Records each job's label and overrides; runs nothing."""

    def __init__(self) -> None:
        self.jobs: dict[str, list[str]] = {}

    def submit(self, fn: Any, label: str, overrides: list[str], *args: Any) -> Future[Any]:
        self.jobs[label] = overrides
        return Future()


def test_the_block_study_runs_each_block_size_in_its_mode_workload_and_rate() -> None:
    from experiments.reproduce import BLOCK_SIZES, BLOCK_STUDY_RATES, block_study

    pool = _Pool()
    keys = [k for k, _ in block_study(pool, ["seed=0"])]  # type: ignore[arg-type]
    assert len(keys) == 3 * len(BLOCK_SIZES)
    for bs in BLOCK_SIZES:
        alpaca = pool.jobs[f"fig18b_alpaca_bs{bs}"]
        assert {"workload=alpaca", f"workload.rate={BLOCK_STUDY_RATES['alpaca']}",
                f"system.block_size={bs}", "system=vllm", "seed=0"} <= set(alpaca)  # fmt: skip
        assert not any("preemption_mode" in o for o in alpaca)  # vLLM's default: recompute
        swap = pool.jobs[f"fig19_swap_bs{bs}"]
        assert {"system.preemption_mode=swap", f"system.block_size={bs}",
                "workload.rate=2.0", "system=vllm"} <= set(swap)  # fmt: skip
    swap_keys = [k for k in keys if k["study"] == "fig19"]
    assert [k["block_size"] for k in swap_keys] == list(BLOCK_SIZES)
    assert {(k["workload"], k["rate"], k["preemption_mode"]) for k in swap_keys} == {
        ("sharegpt", BLOCK_STUDY_RATES["sharegpt"], "swap")
    }


def test_fig19s_swap_runs_follow_the_block_studys_sharegpt_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fig. 19 sets its swap runs beside Fig. 18b's ShareGPT recompute runs: a change of
    that rate moves both (the swap runs had their own 2.0)."""
    from experiments import reproduce

    monkeypatch.setitem(reproduce.BLOCK_STUDY_RATES, "sharegpt", 3.0)
    pool = _Pool()
    keys = [k for k, _ in reproduce.block_study(pool, [], ("fig19",))]  # type: ignore[arg-type]
    for bs in reproduce.BLOCK_SIZES:
        for label in (f"fig19_swap_bs{bs}", f"fig18b_sharegpt_bs{bs}"):
            assert {"workload=sharegpt", "workload.rate=3.0"} <= set(pool.jobs[label]), label
    assert {k["rate"] for k in keys} == {3.0}


def test_the_block_sizes_span_the_papers_fig18b_axis() -> None:
    """1 to 256 in powers of two, as the paper's Fig. 18b: the gap line compares blocks 1
    and 256 with block 16."""
    from experiments.reproduce import BLOCK_SIZES

    assert tuple(2**i for i in range(9)) == BLOCK_SIZES


def test_the_fixed_rates_are_the_ones_the_report_states() -> None:
    """The block study's rates are the ones ``RATES_CHOSEN`` names per workload; Fig. 13
    (b)'s Alpaca rate is the end of the paper's OPT-13B Alpaca axis (Fig. 12 (d))."""
    from experiments.report.fig12_rates import BY_LETTER
    from experiments.reproduce import BLOCK_STUDY_RATES, FIG13_ALPACA_RATE

    assert f"ShareGPT at Fig. 13's {BLOCK_STUDY_RATES['sharegpt']:g} req/s" in clock.RATES_CHOSEN
    assert f"Alpaca at {BLOCK_STUDY_RATES['alpaca']:g} req/s" in clock.RATES_CHOSEN
    assert BY_LETTER["d"].axis == FIG13_ALPACA_RATE


def test_the_appendix_adds_its_own_overheads_to_each_clock() -> None:
    from experiments.reproduce import CLOCK_OVERHEADS_S, OVERHEADS_S, overhead_sensitivity

    keys = [k for k, _ in overhead_sensitivity(_Pool(), [], "paper-a100")]  # type: ignore[arg-type]
    ms = {c: [k["per_step_overhead_ms"] for k in keys if k["clock"] == c] for c in
          ("paper-a100", "roofline")}  # fmt: skip
    assert ms["paper-a100"] == pytest.approx([o * 1e3 for o in CLOCK_OVERHEADS_S])
    assert ms["roofline"] == pytest.approx([o * 1e3 for o in OVERHEADS_S])


class _DonePool:
    """A pool whose jobs finish at once as runs that completed no request (so a command
    stops after its runs, at the too-short check); records each job's overrides."""

    def __init__(self) -> None:
        self.jobs: dict[str, list[str]] = {}

    def __enter__(self) -> _DonePool:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def submit(self, fn: Any, label: str, overrides: list[str], *args: Any) -> Future[Any]:
        self.jobs[label] = overrides
        done: Future[Any] = Future()
        done.set_result({"label": label, "completed": 0})
        return done


class _Stop(Exception):
    """Raised by a stand-in for Fig. 12's searches: no search ever runs here."""


@pytest.fixture
def no_runs(monkeypatch: pytest.MonkeyPatch) -> _DonePool:
    """reproduce with no simulation: jobs finish at once (:class:`_DonePool`) and Fig. 12's
    searches raise :class:`_Stop`, so a refusal that is not made ends fast, not in runs."""
    from experiments import reproduce

    pool = _DonePool()
    monkeypatch.setattr(reproduce, "worker_pool", lambda n: pool)

    def searches(*args: Any, **kw: Any) -> list:
        raise _Stop

    monkeypatch.setattr(reproduce.fig12_rates, "searches", searches)
    return pool


def test_reproduce_runs_fig13b_at_its_rate_and_logs_fig19s_shared_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Fig. 13 (b) runs Alpaca at ``FIG13_ALPACA_RATE``; Fig. 19's progress line counts its
    swap runs and the ShareGPT recompute runs it compares them with."""
    import logging

    from experiments import reproduce

    pool = _DonePool()
    monkeypatch.setattr(reproduce, "worker_pool", lambda n: pool)
    caplog.set_level(logging.INFO, logger="kvlab.reproduce")
    logging.getLogger("kvlab.reproduce").disabled = False  # see test_reproduce_figures
    with pytest.raises(SystemExit):  # every run completed no request: refused after them
        reproduce.main(["--figures", "fig13,fig19", "--out", str(tmp_path)])
    for s in reproduce.FIG2_SYSTEMS:
        over = pool.jobs[f"fig13_alpaca_{s}"]
        assert {"workload=alpaca", f"workload.rate={reproduce.FIG13_ALPACA_RATE}",
                f"system={s}", *reproduce.COSTS["paper-a100"]} <= set(over)  # fmt: skip
    messages = [r.getMessage() for r in caplog.records]
    n = len(reproduce.BLOCK_SIZES)
    assert any(m.startswith(f"fig19: {2 * n} jobs done (") for m in messages), messages
    assert any(m.startswith("fig13: 8 jobs done (") for m in messages), messages


def test_fig12_runs_the_seeds_from_seed_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from experiments import reproduce

    class Stop(Exception):
        pass

    seen: list[Any] = []

    def searches(*args: Any, **kw: Any) -> list:
        seen.extend(args)
        raise Stop

    monkeypatch.setattr(reproduce.fig12_rates, "searches", searches)
    argv = ["--out", str(tmp_path), "--figures", "fig12", "--workers", "1", "--seed", "5",
            "--seeds", "2"]  # fmt: skip
    with pytest.raises(Stop):
        reproduce.main(argv)
    assert seen[3] == (5, 6)


@pytest.mark.parametrize("tol", ["1", "1.5", "0"])
def test_a_rate_tolerance_outside_zero_to_one_is_refused(
    tol: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_runs: _DonePool
) -> None:
    from experiments import reproduce

    with pytest.raises(SystemExit) as ended:
        reproduce.main(["--fig12-rate-tol", tol, "--out", str(tmp_path / "out")])
    assert ended.value.code == 2
    assert "--fig12-rate-tol: must be in (0, 1)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_unknown_fig12_panel_leaves_the_earlier_report_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_runs: _DonePool
) -> None:
    """A bad ``--fig12-panels`` is refused before anything in ``--out`` is touched: the
    earlier report stays, and no runs folder is made."""
    from experiments import reproduce

    (tmp_path / "report.md").write_text("an earlier report")
    with pytest.raises(SystemExit) as ended:
        reproduce.main(["--figures", "table1", "--fig12-panels", "z", "--out", str(tmp_path)])
    assert ended.value.code == 2 and "--fig12-panels: no panel z" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]


@pytest.mark.parametrize(("flags", "seconds"), [([], 600.0), (["--full"], 3600.0)])
def test_the_fixed_rate_runs_are_ten_minutes_or_the_papers_hour(
    flags: list[str], seconds: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from experiments import reproduce

    pool = _DonePool()
    monkeypatch.setattr(reproduce, "worker_pool", lambda n: pool)
    with pytest.raises(SystemExit):
        reproduce.main(["--figures", "fig2", "--out", str(tmp_path), *flags])
    assert f"workload.duration_s={seconds}" in pool.jobs["fig2_vllm"]


def test_sharing_runs_take_the_reports_clock_and_fig12_keeps_its_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from experiments import reproduce

    calls: list[tuple[Any, ...]] = []

    def run_one(
        label: str, overrides: list[str], out: Any, config_out: Any = None
    ) -> dict[str, Any]:
        calls.append((label, overrides, out, config_out))
        return {"label": label, "completed": 3}

    monkeypatch.setattr(reproduce, "run_one", run_one)
    reproduce.run_on_clock(["cost=roofline"], "fig14_x", ["system=vllm"])
    assert calls[-1] == ("fig14_x", ["system=vllm", "cost=roofline"], None, None)
    m = reproduce.run_recorded(tmp_path, ["cost=roofline"], "fig12_y", ["seed=1"])
    # the search keeps the run's config (written by run_one) and its metrics, no tables; the
    # file as simulate writes it, without the label (its folder's name), which m keeps
    assert calls[-1] == ("fig12_y", ["seed=1", "cost=roofline"], None, tmp_path / "fig12_y")
    assert json.loads((tmp_path / "fig12_y" / "metrics.json").read_text()) == {"completed": 3}
    assert m == {"label": "fig12_y", "completed": 3}


def test_a_fig12_panels_clock_lists_only_what_differs_from_the_reports() -> None:
    from experiments.lib.setup import build_setup
    from experiments.report.fig12_rates import BY_LETTER
    from experiments.reproduce import COSTS, compose_config, panel_clocks

    cfg = compose_config(
        [*COSTS["paper-a100"], "model=opt-13b", "hardware=a100-40gb", "system=vllm"]
    )
    main = build_setup(cfg).cost_model.describe()
    clocks = panel_clocks([BY_LETTER["a"], BY_LETTER["c"]], COSTS["paper-a100"], main)
    assert clocks["a"] == ""  # OPT-13B on one A100-40GB: the report's own clock
    assert clocks["c"] and not set(clocks["c"].splitlines()) & set(main.splitlines())


@pytest.mark.parametrize("flag", ["--duration", "--threshold"])
def test_an_infinite_duration_or_threshold_is_refused(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_runs: _DonePool
) -> None:
    from experiments import reproduce

    with pytest.raises(SystemExit) as ended:
        reproduce.main([flag, "inf", "--out", str(tmp_path / "out")])
    assert ended.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: {flag}: not a number > 0")


def test_the_clocks_compose_as_named_and_a_request_count_replaces_the_duration() -> None:
    from experiments.reproduce import COSTS, compose_config

    assert compose_config(COSTS["roofline"]).cost.kind == "roofline"
    paper = compose_config(COSTS["paper-a100"]).cost
    assert (paper.kind, paper.stack) == ("profiled", "vllm-2023")
    cfg = compose_config(["workload.num_requests=3"])
    assert (cfg.workload.num_requests, cfg.workload.duration_s) == (3, None)
