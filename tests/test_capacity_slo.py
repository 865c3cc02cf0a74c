"""``experiments.capacity --slo-attainment A``: the ``slo`` rule of
``rate_search.failed_rules`` (at least A of a run's requests meet every SLO of its
``slo_ms``), its heading and columns; and one colour and line style per system in the
capacity plot, the sweep plot and the report's figures, with titles inside the figure."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from matplotlib.colors import to_hex

from experiments import capacity
from experiments.report import figures, sweep_plot
from experiments.report.rate_search import RULES, failed_rules, passes

OK = {"normalized_latency": 0.5, "num_requests": 200, "completed": 200,
      "unfinished_at_last_arrival": 0.05, "slo_attainment": 0.9}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "rules"),
    [
        ({}, ()),  # exactly A passes
        ({"slo_attainment": 1.0}, ()),
        ({"slo_attainment": 0.8999}, ("slo",)),
        ({"slo_attainment": 0.0}, ("slo",)),
        ({"slo_attainment": None}, ("slo",)),  # missing: the run had no slo_ms
        ({"slo_attainment": math.nan}, ("slo",)),
        ({"normalized_latency": 2.0, "slo_attainment": 0.5}, ("latency", "slo")),
    ],
)  # fmt: skip
def test_the_slo_rule_fails_a_run_below_the_share_or_without_it(
    change: dict[str, Any], rules: tuple[str, ...]
) -> None:
    run = OK | change
    assert failed_rules(run, 1.0, 0.1, 0.9) == rules
    assert passes(run, 1.0, 0.1, 0.9) is (not rules)
    # without the option the rule is not applied: the other rules as before
    assert failed_rules(run, 1.0, 0.1) == tuple(r for r in rules if r != "slo")
    assert RULES[-1] == "slo"


def test_a_missing_slo_attainment_key_fails_the_rule_alone() -> None:
    run = {k: v for k, v in OK.items() if k != "slo_attainment"}
    assert failed_rules(run, 1.0, 0.1, 0.5) == ("slo",)
    assert failed_rules(run, 1.0, 0.1) == ()


SMALL = ["workload.duration_s=60", "--systems", "vllm", "--seeds", "1",
         "--rates", "1,4", "--workers", "1", "--bisect-evals", "1"]  # fmt: skip
SLO = "slo_ms={ttft: 2000, tpot: 200}"
# long enough that vLLM keeps up at 2 req/s and misses the SLO at 4
SEARCH = ["workload.duration_s=120", "--systems", "vllm", "--seeds", "1",
          "--rates", "1,2,4", "--workers", "1", "--bisect-evals", "1"]  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "flags", "line"),
    [
        ([], ["--slo-attainment", "0.9"],
         "error: --slo-attainment: needs the SLOs it judges: pass slo_ms"),
        ([SLO], ["--slo-attainment", "0"], "error: --slo-attainment: not a share in (0, 1]"),
        ([SLO], ["--slo-attainment", "1.01"], "error: --slo-attainment: not a share in (0, 1]"),
        ([SLO], ["--threshold", "inf"],
         "error: --threshold: inf (no latency limit) needs --slo-attainment"),
    ],
)  # fmt: skip
def test_the_option_without_slo_ms_is_one_line_before_any_run(
    overrides: list[str], flags: list[str], line: str, tmp_path: Path, capsys
) -> None:
    with pytest.raises(SystemExit) as ended:
        capacity.main([*overrides, *SMALL, *flags, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1 and err.startswith(line), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("threshold", ["1", "inf"])
def test_a_real_search_judges_each_run_by_its_slo_attainment(
    threshold: str, tmp_path: Path, capsys
) -> None:
    out = capacity.main([SLO, *SEARCH, "--slo-attainment", "0.9", "--threshold", threshold,
                         "--out", str(tmp_path / "out")])  # fmt: skip
    runs = pd.read_csv(out / "runs.csv", keep_default_na=False)
    for _, r in runs.iterrows():
        rules = set(filter(None, r["fails_on"].split("+")))
        assert ("slo" in rules) == (float(r["slo_attainment"]) < 0.9)
        assert ("latency" in rules) == (float(r["normalized_latency"]) > float(threshold))
    assert (runs["fails_on"].str.contains("slo")).any()  # the grid's top misses the SLO
    cap = pd.read_csv(out / "capacity.csv")
    row = cap.iloc[0]
    assert row["max_rate"] > 0 and row["slo_attainment_at_rate"] >= 0.9
    assert row["min_slo_attainment"] == 0.9
    printed = capsys.readouterr().out
    assert "  slo: at least 0.9 of the requests meet every SLO (ttft <= 2000 ms, tpot <= " \
        "200 ms)" in printed.splitlines()  # fmt: skip


def test_without_the_option_the_search_and_its_heading_are_unchanged(
    tmp_path: Path, capsys
) -> None:
    out = capacity.main([SLO, *SEARCH, "--out", str(tmp_path / "out")])
    runs = pd.read_csv(out / "runs.csv", keep_default_na=False)
    assert not runs["fails_on"].str.contains("slo").any()
    assert "slo_attainment" in runs  # recorded where the runs have slo_ms
    assert "min_slo_attainment" not in pd.read_csv(out / "capacity.csv")
    assert "  slo:" not in capsys.readouterr().out


def _cap_rows(system: str) -> list[dict[str, Any]]:
    return [
        {"setting": "search", "system": system, "rate": 1.0, "seed": 0, "passes": True,
         "fails_on": "", "normalized_latency": 0.1, "slo_attainment": 0.95},
        {"setting": "search", "system": system, "rate": 2.0, "seed": 0, "passes": False,
         "fails_on": "slo", "normalized_latency": 0.2, "slo_attainment": 0.5},
    ]  # fmt: skip


def test_the_heading_names_the_slo_rule_with_its_share_and_limits() -> None:
    cap = capacity.capacity_frame(_cap_rows("vllm"), ["vllm"])
    assert cap.loc[0, "slo_attainment_at_rate"] == 0.95
    rule = capacity.SloRule(0.95, (("ttft", 2000.0), ("tpot", 200.0)))
    lines = capacity.print_table(cap, 1.0, slo=rule).splitlines()
    assert lines[1:5] == [
        "  latency: normalized latency <= 1 s/token",
        "  incomplete: every request completes",
        "  backlog: at most 10% of the trace (of 100 requests on a shorter one) unfinished "
        "when its last request arrives",
        "  slo: at least 0.95 of the requests meet every SLO (ttft <= 2000 ms, tpot <= 200 ms)",
    ]
    assert "2 slo" in lines[6]
    assert capacity.print_table(cap, 1.0).splitlines()[1:4] == lines[1:4]
    inf = capacity.print_table(cap, math.inf, slo=rule).splitlines()
    assert inf[1] == "  latency: normalized latency measured (--threshold inf: no limit)"


SYSTEMS = ["vllm", "orca_oracle", "orca_pow2", "orca_max"]


def _curves() -> pd.DataFrame:
    # Orca (Pow2) and Orca (Oracle) coincide at every rate
    rows = []
    for system in SYSTEMS:
        for rate, lat in ((1.0, 0.2), (2.0, 0.4), (4.0, 3.0)):
            rows.append({"setting": "search", "system": system, "rate": rate, "seeds": 1,
                         "normalized_latency_mean": lat, "normalized_latency_min": lat,
                         "normalized_latency_max": lat, "passes": lat <= 1,
                         "failed": lat > 1, "num_requests_mean": 100})  # fmt: skip
    return pd.DataFrame(rows)


def _capacity() -> pd.DataFrame:
    return pd.DataFrame([{"system": s, "max_rate": 2.0, "rate_lo": 2.0, "rate_hi": 2.0,
                          "first_failing_rate": 4.0, "rate_open": False,
                          "rate_hi_open": False} for s in SYSTEMS])  # fmt: skip


def _lines(ax: Any) -> dict[str, Any]:
    """The legend's line per label: the system's curve."""
    return {line.get_label(): line for line in ax.get_lines()
            if not line.get_label().startswith("_")}  # fmt: skip


def test_a_system_has_one_colour_in_the_capacity_sweep_and_report_plots(
    tmp_path: Path, monkeypatch
) -> None:
    plt = figures.pyplot(headless=True)
    cap_ax = figures.capacity_curves(_curves(), _capacity(), 1.0, SYSTEMS, "s").axes[0]
    curves = _curves().assign(panel="p")
    report_ax = figures.fig12_panels(curves, _capacity().assign(panel="p"), 1.0,
                                     [("p", "t", 4.0)]).axes[0]  # fmt: skip
    kept = {}
    monkeypatch.setattr(figures, "save", lambda fig, out, name: kept.setdefault(name, fig))
    frame = pd.DataFrame({"system": SYSTEMS * 2, "workload.rate": [1] * 4 + [2] * 4,
                          "normalized_latency": [0.1] * 8, "status": ["ok"] * 8})  # fmt: skip
    table = sweep_plot.aggregate(frame, "workload.rate", "normalized_latency", "system",
                                 tmp_path / "summary.csv")  # fmt: skip
    sweep_plot.plot({"normalized_latency": table}, "workload.rate", "system", tmp_path)
    sweep_ax = kept["sweep_normalized_latency"].axes[0]
    cap_lines, report_lines = _lines(cap_ax), _lines(report_ax)
    sweep_lines = _lines(sweep_ax) or {
        c.get_label(): c.lines[0] for c in sweep_ax.containers
    }  # errorbar containers carry the label
    for system in SYSTEMS:
        label = figures.SYSTEM_LABELS[system]
        want = figures.SYSTEM_COLORS[system]
        got = {to_hex(cap_lines[label].get_color()), to_hex(report_lines[label].get_color()),
               to_hex(sweep_lines[system].get_color())}  # fmt: skip
        assert got == {want}, (system, got)
        style = {cap_lines[label].get_linestyle(), report_lines[label].get_linestyle(),
                 sweep_lines[system].get_linestyle()}  # fmt: skip
        assert len(style) == 1, (system, style)
    # the coinciding curves: Pow2's broken line drawn above Oracle's solid one
    pow2, oracle = cap_lines["Orca (Pow2)"], cap_lines["Orca (Oracle)"]
    assert pow2.get_linestyle() != oracle.get_linestyle()
    assert pow2.get_zorder() > oracle.get_zorder()
    assert list(pow2.get_ydata()) == list(oracle.get_ydata())  # the data unchanged
    plt.close("all")


def test_a_long_capacity_title_stays_inside_the_figure(tmp_path: Path) -> None:
    plt = figures.pyplot(headless=True)
    setting = ("qwen3-8b on 1 x l40s, azure_conv, cost=profiled (stack vllm-0.9-l40s); the "
               "trace (its first 1234 requests) runs at 4.56 req/s: rate r replays it at "
               "time_scale 4.56/r")  # fmt: skip
    slo = capacity.SloRule(0.9, (("ttft", 2000.0), ("tpot", 200.0))).words()
    fig = figures.capacity_curves(_curves(), _capacity(), 1.0, SYSTEMS, setting, slo)
    figures.save(fig, tmp_path, "capacity")
    renderer = fig.canvas.get_renderer()
    box, title = fig.bbox, fig.axes[0].title.get_window_extent(renderer)
    assert box.x0 <= title.x0 and title.x1 <= box.x1 and title.y1 <= box.y1
    assert "at least 0.9 of the requests" in " ".join(fig.axes[0].get_title().split())
    plt.close(fig)
