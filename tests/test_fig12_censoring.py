"""Fig. 12's censored rates: a system (or seed) that passed every rate tried has only a lower
bound on its sustainable rate, one that passed none only an upper bound; the capacity table
marks them, the report prints them as bounds, and the gap line gives a verdict only where
the bounds decide it. Also: the search grows no further than ``grow_to`` x the grid's top,
and the section can be rebuilt from a run's per-run CSVs."""

from __future__ import annotations

import math
import re
from pathlib import Path

import hypothesis.strategies as st
import pandas as pd
import pytest
from hypothesis import given, settings

from experiments.report import bound_text, fig12_rates
from experiments.report.rate_search import (
    Search,
    capacity_table,
    curve_table,
    run_search,
    seed_open,
    seed_rates,
)

PANEL = fig12_rates.BY_LETTER["a"]  # ShareGPT: the paper's ratios apply; axis 2 req/s
ORACLE_RANGE = (1.7, 2.7)  # the paper's vLLM / Orca (Oracle), FIG12_SHAREGPT_RATIO


def runner(caps: dict[str, float], seed_caps: dict[tuple[str, int], float] | None = None):
    """A run passes at or under its system's (or its seed's) capacity, fails above it."""

    def run(label: str, overrides: list[str]) -> dict:
        o = dict(x.split("=", 1) for x in overrides)
        rate, system = float(o["workload.rate"]), o["system"]
        cap = (seed_caps or {}).get((system, int(o.get("seed", -1))), caps[system])
        ok = rate <= cap
        return {"num_requests": 200, "completed": 200, "normalized_latency": 0.2 if ok else 5.0,
                "unfinished_at_last_arrival": 0.0, "mean_e2el_ms": 1000.0}  # fmt: skip

    return run


def panel_rows(caps: dict[str, float], seeds: tuple[int, ...] = (0,), seed_caps=None) -> list:
    rows = []
    for s in fig12_rates.searches([PANEL], True, None, seeds, bisect_evals=4):
        if s.system in caps:
            rows += run_search(runner(caps, seed_caps), s, 1.0)
    return rows


def report(rows: list) -> tuple[pd.DataFrame, str]:
    cap = fig12_rates.capacity(rows)
    return cap, fig12_rates.section(cap, pd.DataFrame(rows), 1.0)


def table_row(text: str, label: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {label} |"))


def gap(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("Gap (a)"))


def test_a_system_passing_every_rate_has_only_a_lower_bound() -> None:
    # vLLM's capacity lies above every rate tried; Orca (Oracle)'s true ratio is inside the
    # paper's range, but the point ratio of the highest rates tried is below it.
    cap, text = report(panel_rows({"vllm": 30 * PANEL.axis, "orca_oracle": 6.5 * PANEL.axis}))
    v = cap.set_index("system").loc["vllm"]
    assert v["rate_open"] and v["rate_lo_open"] and v["rate_hi_open"]
    top = float(v["max_rate"])
    assert f"| ≥ {top:.3g} [≥ {top:.3g}, ≥ {top:.3g}] (passed every rate tried) |" in table_row(
        text, "vLLM"
    )
    o = cap.set_index("system").loc["orca_oracle"]
    assert o["vllm_ratio_bound"] == "lower"
    assert top / float(o["max_rate"]) < ORACLE_RANGE[0]  # the point alone would read "outside"
    # the bound holds whatever Orca's rate is below the lowest rate it failed at
    ratio = top / float(o["first_failing_rate"])
    assert ratio <= 30 / 6.5
    assert f"| ≥ {ratio:.2f}× |" in table_row(text, "Orca (Oracle)")
    line = gap(text)
    assert f"vLLM passes every rate tried, so it sustains ≥ {top:.3g} req/s" in line
    assert f"vLLM / Orca (Oracle) ≥ {ratio:.2f}×" in line
    assert re.search(r"Orca \(Oracle\) ≥ [^;]*; paper 1\.7–2\.7×: not decided", line)
    assert "outside by" not in line


def test_a_baseline_passing_every_rate_makes_the_ratio_an_upper_bound() -> None:
    cap, text = report(panel_rows({"vllm": 0.9 * PANEL.axis, "orca_oracle": 100.0}))
    o = cap.set_index("system").loc["orca_oracle"]
    assert o["rate_open"] and o["vllm_ratio_bound"] == "upper"
    # vLLM's rate may lie anywhere below the lowest rate it failed at
    ratio = float(cap.set_index("system").loc["vllm", "first_failing_rate"]) / float(o["max_rate"])
    assert ratio >= 0.9 * PANEL.axis / 100.0
    assert f"| ≤ {ratio:.2f}× |" in table_row(text, "Orca (Oracle)")
    # every ratio the rates tried allow is below the paper's range: decided
    low, high = bound_text.ratio_bounds(cap.set_index("system"), "orca_oracle")
    assert low == 0 and high < ORACLE_RANGE[0]
    assert re.search(r"Orca \(Oracle\) ≤ [^;]*; paper 1\.7–2\.7×: outside: at most", gap(text))


def test_vllm_passing_no_rate_gives_upper_bounds_not_zero_ratios() -> None:
    caps = {"vllm": 0.01, "orca_oracle": 0.65 * PANEL.axis, "orca_max": 0.4 * PANEL.axis}
    cap, text = report(panel_rows(caps))
    by = cap.set_index("system")
    lowest = PANEL.rates[0]
    assert by.loc["vllm", "vllm_ratio"] == 1.0  # not inf (0 / 0)
    assert by.loc["orca_oracle", "vllm_ratio_bound"] == "lower"  # 0: nothing passed
    assert f"| < {lowest:.3g} (none of the rates tried passed) |" in table_row(text, "vLLM")
    bound = lowest / float(by.loc["orca_oracle", "max_rate"])
    assert f"| < {bound:.2f}× |" in table_row(text, "Orca (Oracle)")
    assert "0.00×" not in text and "inf" not in text
    line = gap(text)
    assert f"vLLM passes none of the rates tried, so it sustains < {lowest:.3g} req/s" in line
    assert f"vLLM / Orca (Oracle) < {bound:.2f}×" in line
    assert "outside by" not in line  # no verdict from a point value of 0


def test_no_verdict_when_neither_vllm_nor_the_baseline_passed_a_rate() -> None:
    _, text = report(panel_rows({"vllm": 0.01, "orca_oracle": 0.01}))
    assert "| — (vLLM passed none of the rates tried and Orca (Oracle) passed none" in (
        table_row(text, "Orca (Oracle)")
    )
    line = gap(text)
    assert "vLLM / Orca (Oracle): not bounded" in line
    assert "paper 1.7–2.7×: not decided" in line and "outside" not in line


@settings(max_examples=60, deadline=None)
@given(
    v_cap=st.floats(0.01, 40.0),
    o_cap=st.floats(0.01, 40.0),
)
def test_the_bounds_hold_the_true_ratio_and_a_verdict_is_never_wrong(
    v_cap: float, o_cap: float
) -> None:
    cap, text = report(panel_rows({"vllm": v_cap, "orca_oracle": o_cap}))
    c = cap.set_index("system")
    low, high = bound_text.ratio_bounds(c, "orca_oracle")
    true = v_cap / o_cap
    assert low <= true * (1 + 1e-9) and true <= high * (1 + 1e-9)
    kind, value = bound_text.ratio_estimate(c, "orca_oracle")
    if kind in ("≥", ">"):  # a printed lower bound holds for the true ratio
        assert low <= value <= true * (1 + 1e-9)
    if kind in ("≤", "<"):
        assert true <= value * (1 + 1e-9) and value <= high
    verdict = re.search(r"Orca \(Oracle\)[^;]*; paper 1\.7–2\.7×: ([a-z]+)", gap(text))
    verdict = verdict or re.search(r"Orca \(Oracle\)[^(]*\(paper 1\.7–2\.7×: ([a-z]+)", gap(text))
    assert verdict is not None
    inside = ORACLE_RANGE[0] <= true <= ORACLE_RANGE[1]
    line = gap(text)
    if kind != "=" and verdict.group(1) != "not":  # a bound decided it: it must be right
        assert (verdict.group(1) == "inside") == inside, line


def seed_rows(system: str, per_seed: dict[int, float], rates=(1.0, 2.0, 3.0, 4.0)) -> list:
    return [{"setting": "a", "system": system, "seed": seed, "rate": rate, "passes": rate <= cap}
            for seed, cap in per_seed.items() for rate in rates]  # fmt: skip


def test_a_failure_counts_though_another_seed_is_unmeasured_at_that_rate() -> None:
    # seed 0 fails at 3; seed 1's trace at 3 held no request (passes None)
    rows = [{"setting": "a", "system": "vllm", "seed": seed, "rate": rate, "passes": ok}
            for seed, rate, ok in ((0, 1.0, True), (1, 1.0, True), (0, 2.0, True),
                                   (1, 2.0, True), (0, 3.0, False), (1, 3.0, None),
                                   (0, 4.0, True), (1, 4.0, True))]  # fmt: skip
    (v,) = capacity_table(rows, "vllm")
    assert (v["max_rate"], v["first_failing_rate"], v["rate_open"]) == (2.0, 3.0, False)
    # a rate where no run failed but one is unmeasured stays out
    rows[4]["passes"] = True
    (v,) = capacity_table(rows, "vllm")
    assert (v["max_rate"], v["first_failing_rate"], v["rate_open"]) == (4.0, None, True)


def test_a_seed_that_never_failed_leaves_its_interval_end_open() -> None:
    rows = seed_rows("vllm", {0: 3.0, 1: 9.0}) + seed_rows("orca_max", {0: 1.0, 1: 9.0})
    assert seed_open(rows[:8]) == {0: False, 1: True}
    assert seed_rates(rows[:8]) == {0: 3.0, 1: 4.0}  # seed 1's 4.0 is only a lower bound
    by = {r["system"]: r for r in capacity_table(rows, "vllm")}
    o, v = by["orca_max"], by["vllm"]
    assert (o["rate_lo"], o["rate_hi"]) == (1.0, 4.0)
    assert not o["rate_open"] and not o["rate_lo_open"] and o["rate_hi_open"]
    assert not v["rate_lo_open"] and v["rate_hi_open"]
    # ratio_lo = vLLM's lo / orca's (open) hi: may be lower; ratio_hi = vLLM's open hi / lo
    assert (o["ratio_lo_bound"], o["ratio_hi_bound"], o["vllm_ratio_bound"]) == (
        "upper", "lower", "exact")  # fmt: skip
    assert (o["ratio_lo"], o["ratio_hi"], o["vllm_ratio"]) == (0.75, 4.0, 3.0)  # unchanged


def test_open_seed_ends_are_marked_in_the_report_and_the_csv(tmp_path: Path) -> None:
    caps = {"vllm": 1.5, "orca_oracle": 0.7}
    seed_caps = {("orca_oracle", 1): 100.0}  # seed 1 of Orca (Oracle) never fails
    rows = panel_rows(caps, seeds=(0, 1), seed_caps=seed_caps)
    from experiments.report.figures import pyplot

    text = fig12_rates.write(rows, tmp_path, pyplot(headless=True), 1.0)
    written = pd.read_csv(tmp_path / "fig12_capacity.csv").set_index("system")
    assert bool(written.loc["orca_oracle", "rate_hi_open"])
    assert not bool(written.loc["orca_oracle", "rate_open"])
    assert written.loc["orca_oracle", "ratio_lo_bound"] == "upper"
    hi = float(written.loc["orca_oracle", "rate_hi"])
    assert f", ≥ {hi:.3g}] |" in table_row(text, "Orca (Oracle)")
    assert re.search(r"× \[≤ [0-9.]+, [0-9.]+\] \|", table_row(text, "Orca (Oracle)"))


def test_growth_above_the_grid_stops_at_grow_to_times_its_top() -> None:
    search = Search("t", "a", "vllm", ("system=vllm",), (0.5, 1.0, 2.0), seeds=(0,),
                    grow_to=4.0)  # fmt: skip
    rows = run_search(runner({"vllm": 1e6}), search, 1.0)
    assert max(r["rate"] for r in rows) == pytest.approx(8.0)  # 4 x 2, not 1.5^k past it
    top = max(r["rate"] for r in panel_rows({"vllm": 1e6}))
    assert top == pytest.approx(8 * PANEL.axis)  # the module doc: "up to 8x the axis"


def test_the_section_is_rebuilt_from_the_per_run_csvs(tmp_path: Path, capsys) -> None:
    rows = panel_rows({"vllm": 30 * PANEL.axis, "orca_oracle": 0.6, "orca_max": 0.3},
                      seeds=(0, 1))  # fmt: skip
    from experiments.report.figures import pyplot

    text = fig12_rates.write(rows, tmp_path, pyplot(headless=True), 1.0)
    stale = pd.read_csv(tmp_path / "fig12_capacity.csv")
    assert fig12_rates.main([str(tmp_path)]) == text
    assert capsys.readouterr().out == text
    old = stale.drop(columns=list(fig12_rates.BOUND_COLUMNS))
    with pytest.raises(ValueError, match="rebuild"):
        fig12_rates.section(old, pd.DataFrame(rows), 1.0)
    old.to_csv(tmp_path / "fig12_capacity.csv", index=False)
    fig12_rates.main([str(tmp_path), "--write-capacity"])
    rebuilt = pd.read_csv(tmp_path / "fig12_capacity.csv")
    assert list(rebuilt.columns) == list(stale.columns)
    pd.testing.assert_frame_equal(rebuilt, stale)
    assert not math.isnan(float(rebuilt["max_rate"].iloc[0]))
    curves = (tmp_path / "fig12_curves.csv").read_bytes()
    for png in tmp_path.glob("*.png"):
        png.unlink()
    (tmp_path / "fig12_curves.csv").unlink()
    assert fig12_rates.main([str(tmp_path), "--write-figures"]) == text
    assert (tmp_path / "fig12_curves.csv").read_bytes() == curves
    assert {p.name for p in tmp_path.glob("*.png")} == {
        "fig12_all_panels.png", f"{PANEL.name}.png"}  # fmt: skip


def test_the_figure_marks_open_rates_and_systems_that_passed_none(tmp_path: Path) -> None:
    """Fig. 12's figure: "≥" on a rate that is only a lower bound, "→" past an interval end
    that is, and a left caret at the lowest rate tried for a system that passed none; a
    bracketed rate has none of them."""
    from experiments.report.figures import fig12_panels, pyplot

    pyplot(headless=True)
    rows = panel_rows({"vllm": 100.0, "orca_oracle": 1.0, "fastertransformer": 0.0})
    cap = fig12_rates.capacity(rows)
    curves = pd.DataFrame(curve_table(rows)).rename(columns={"setting": "panel"})
    fig = fig12_panels(curves, cap, 1.0, [("a", PANEL.title, PANEL.axis)])
    ax = fig.axes[0]
    assert sorted(t.get_text() for t in ax.texts) == ["→", "≥"]
    (vllm,) = [t for t in ax.texts if t.get_text() == "≥"]
    assert vllm.xy[0] == pytest.approx(float(cap.set_index("system").loc["vllm", "max_rate"]))
    carets = [line for line in ax.lines if line.get_marker() == 8]
    assert len(carets) == 1
    lowest = min(r["rate"] for r in rows if r["system"] == "fastertransformer")
    assert carets[0].get_xdata()[0] == pytest.approx(lowest)


def test_a_one_panel_figure_keeps_its_axes_under_the_wrapped_title(tmp_path: Path) -> None:
    """A one-panel Fig. 12 (``fig12a_*.png``) wraps its legend title to nine lines: the
    figure grows by them, so the axes keep a panel's height and the y label stays inside
    the figure (it had been squeezed to a 0.8-inch strip, its label cut at the bottom)."""
    from experiments.report.figures import fig12_panels, pyplot, save

    plt = pyplot(headless=True)
    rows = panel_rows({"vllm": 2.0, "orca_oracle": 1.0, "fastertransformer": 0.2})
    cap = fig12_rates.capacity(rows)
    curves = pd.DataFrame(curve_table(rows)).rename(columns={"setting": "panel"})
    fig = fig12_panels(curves, cap, 1.0, [("a", PANEL.title, PANEL.axis)])
    save(fig, tmp_path, "one_panel")
    ax = fig.axes[0]
    assert ax.get_position().height * fig.get_size_inches()[1] >= 2.0
    label = ax.yaxis.label.get_window_extent(fig.canvas.get_renderer())
    assert fig.bbox.y0 <= label.y0 and label.y1 <= fig.bbox.y1
    plt.close(fig)


def test_each_panel_prints_the_clock_lines_the_cost_model_section_does_not() -> None:
    from experiments.reproduce import COSTS, build_setup, compose_config, panel_clocks

    main = build_setup(compose_config([*COSTS["paper-a100"], "system=vllm"])).cost_model
    b = fig12_rates.BY_LETTER["b"]
    clocks = panel_clocks([PANEL, b], COSTS["paper-a100"], main.describe())
    assert clocks[PANEL.letter] == ""  # panel (a) runs the report's own clock
    assert clocks["b"].startswith("profiled cost model: opt-66b on 4 × a100-40gb")
    assert "tp 4: a ring all-reduce" in clocks["b"] and "7.678 ms" in clocks["b"]
    rows = panel_rows({"vllm": 1.0, "orca_max": 0.5})
    cap = fig12_rates.capacity(rows)
    text = fig12_rates.section(cap, pd.DataFrame(rows), 1.0, clocks)
    assert "Clock: the one under *Cost model*." in text


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "holds no Fig. 12 per-run CSV"),
        ("", "empty: no per-run rows"),
        ("a,b\n1,2\n", "missing column(s) setting, system, rate"),
    ],
)
def test_a_folder_without_good_per_run_csvs_is_one_line(
    tmp_path: Path, capsys, content: str | None, problem: str
) -> None:
    path = tmp_path / f"{PANEL.name}.csv"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as ended:
        fig12_rates.main([str(tmp_path)])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and problem in err
    assert str(path if content is not None else tmp_path) in err


@pytest.mark.parametrize("threshold", ["nan", "0", "-1"])
def test_a_threshold_no_run_could_use_is_one_line(tmp_path: Path, capsys, threshold) -> None:
    with pytest.raises(SystemExit) as ended:
        fig12_rates.main([str(tmp_path), "--threshold", threshold])
    assert ended.value.code == 2
    assert capsys.readouterr().err.startswith("error: --threshold: not a number > 0 (got ")


def test_the_curves_tell_a_failed_rate_from_an_unmeasured_one() -> None:
    rows = [{"setting": "a", "system": "vllm", "seed": seed, "rate": rate, "passes": ok,
             "normalized_latency": 0.1}
            for rate, seed, ok in ((1.0, 0, True), (1.0, 1, None), (2.0, 0, False),
                                   (2.0, 1, None), (3.0, 0, True), (3.0, 1, True))]  # fmt: skip
    by_rate = {r["rate"]: (r["passes"], r["failed"]) for r in curve_table(rows)}
    assert by_rate == {1.0: (False, False), 2.0: (False, True), 3.0: (True, False)}
