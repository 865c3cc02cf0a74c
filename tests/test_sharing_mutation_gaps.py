"""Behaviours of the sharing figures (Fig. 14–17), the Fig. 15 memory-saving metric and the
sweep plot that the other tests leave open, each pinned on small hand-made inputs: which run
Fig. 15's saving is read from, its gap line against the paper, the figures' search configs,
bound legends, and the sweep plot's aggregation and axes."""

from __future__ import annotations

import math
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import matplotlib
import pandas as pd
import pytest

from core.metrics.summary import sharing_saving_pct, summarize
from experiments.report import (
    fig14_sampling,
    fig15_sharing,
    fig16_prefix,
    fig17_chatbot,
    sharing,
    sweep_plot,
)
from experiments.report.figures import pyplot
from tests.test_sharing_report_bounds import row_of, runs

matplotlib.use("Agg")
NAN = float("nan")


# --- the metric: kv_sharing_saving_pct -------------------------------------------------


def test_saving_is_nan_when_no_step_was_recorded() -> None:
    """No step at all is "no block held": NaN (so Fig. 15 leaves the run out), not 0 %."""
    empty = pd.DataFrame({"duration_s": [], "kv_logical_blocks": [], "kv_physical_blocks": []})
    assert math.isnan(sharing_saving_pct(empty))


def _requests() -> pd.DataFrame:
    return pd.DataFrame({
        "request_id": [0], "status": ["finished"], "arrival_s": [0.0], "finish_s": [4.0],
        "prompt_len": [8], "output_len": [4], "num_seqs": [2], "ttft_s": [1.0],
        "tpot_s": [1.0], "e2el_s": [4.0], "num_preemptions": [0],
    })  # fmt: skip


def _steps() -> pd.DataFrame:
    n = 3
    return pd.DataFrame({
        "duration_s": [2.0, 1.0, 1.0], "running_requests": [1] * n, "batch_requests": [1] * n,
        "num_waiting": [0] * n, "num_swapped": [0] * n, "kv_token_states": [16] * n,
        "kv_reserved": [0] * n, "kv_internal_frag": [0] * n, "kv_allocator_padding": [0] * n,
        "kv_free": [48] * n, "kv_logical_blocks": [8, 4, 4], "kv_physical_blocks": [2, 4, 4],
    })  # fmt: skip


def test_summary_saving_weights_every_step() -> None:
    """summarize's ``kv_sharing_saving_pct`` is the duration-weighted ratio over every step,
    the first included: 100 * (2*6) / (2*8 + 4 + 4)."""
    out = summarize(_requests(), _steps())
    assert out["kv_sharing_saving_pct"] == pytest.approx(100 * 12 / 24)


# --- Fig. 15: memory saved by sharing ------------------------------------------------------


def _fig15_rows() -> list[dict[str, Any]]:
    """Fig. 14's rows: per setting vLLM passes 2 and 4 req/s and fails at 8, with a
    different saving at each rate (the one at 4 req/s is the figure's); Orca rows too."""
    savings = {  # rate -> saving, per setting
        "n 2": {2.0: 9.0, 4.0: 7.0, 8.0: 8.5},
        "n 4": {2.0: 6.0, 4.0: 5.0, 8.0: None},  # a run with no saving recorded
        "n 6": {2.0: 6.5, 4.0: NAN, 8.0: 7.5},  # no block held at the sustained rate
        "beam 2": {2.0: 38.0, 4.0: 40.0, 8.0: 41.0},
        "beam 4": {2.0: 50.0, 4.0: 60.0, 8.0: 62.0},
    }
    rows = []
    for setting, by_rate in savings.items():
        for system in ("orca_oracle", "vllm"):
            for rate, pct in by_rate.items():
                saving = pct if system == "vllm" else 0.0
                rows.append({"setting": setting, "system": system, "rate": rate, "seed": 0,
                             "passes": rate < 8.0, "kv_sharing_saving_pct": saving})  # fmt: skip
    return rows


def test_fig15_saving_is_read_at_the_highest_sustained_rate_in_fig14_order() -> None:
    """Each setting's saving is its vLLM run at the highest rate that passed (not the largest
    saving seen), the range spans every vLLM run with a number (None and NaN left out), and
    the rows keep Fig. 14's setting order."""
    t = fig15_sharing.table(_fig15_rows()).set_index("setting")
    assert list(t.index) == ["n 2", "n 4", "n 6", "beam 2", "beam 4"]
    assert t.loc["n 2", ["rate", "saving_pct", "min_saving_pct", "max_saving_pct"]].tolist() == [
        4.0, 7.0, 7.0, 9.0]  # fmt: skip
    assert t.loc["n 4", ["min_saving_pct", "max_saving_pct"]].tolist() == [5.0, 6.0]
    assert math.isnan(t.loc["n 6", "saving_pct"])
    assert t.loc["n 6", ["min_saving_pct", "max_saving_pct"]].tolist() == [6.5, 7.5]


def test_fig15_section_prints_the_gap_to_the_papers_range(tmp_path: Path) -> None:
    """The report: a NaN saving prints "—", and per kind the gap line gives kvlab's range of
    sustained-rate savings and its ends' differences to the paper's range (§6.3), the beam
    note following the beam-search line only."""
    text = fig15_sharing.write(_fig15_rows(), tmp_path, pyplot(headless=True))
    assert row_of(text, "n 2") == "| n 2 | 4.00 | 7.0 | 7.0–9.0 | 6.1–9.8 |"
    assert row_of(text, "n 6") == "| n 6 | 4.00 | — | 6.5–7.5 | 6.1–9.8 |"
    # n: sustained-rate savings 7.0 (n 2), 5.0 (n 4); n 6 held no block
    assert (
        "Gap, parallel sampling: kvlab 5.0–7.0 % vs paper 6.1–9.8 % "
        "(low end -1.1, high end -2.8 points)." in text
    )
    assert (
        "Gap, beam search: kvlab 40.0–60.0 % vs paper 37.6–55.2 % "
        "(low end +2.4, high end +4.8 points)." in text
    )
    assert text.count(fig15_sharing.BEAM_NOTE) == 1
    assert text.index(fig15_sharing.BEAM_NOTE) > text.index("Gap, beam search")
    assert "nan" not in text


def test_fig15_prints_no_gap_for_a_kind_without_a_saving(tmp_path: Path) -> None:
    """A kind whose every setting held no block at its sustained rate has no gap line (and no
    "nan" in the report)."""
    rows = [r for r in _fig15_rows() if r["setting"] in ("n 6", "beam 2")]
    text = fig15_sharing.write(rows, tmp_path, pyplot(headless=True))
    assert "Gap, parallel sampling" not in text and "Gap, beam search" in text
    assert "nan" not in text


# --- Fig. 14 ---------------------------------------------------------------------------


def _fig14_rows(
    beam6_vllm: tuple[float, ...], beam6_vllm_fail: tuple[float, ...], beam6_orca_fail: float = 4
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for kind, k in fig14_sampling.SETTINGS:
        orca_fail = beam6_orca_fail if (kind, k) == ("beam", 6) else 4
        rows += runs(f"{kind} {k}", "orca_oracle", (2,), (orca_fail, 8), (0, 1))
        if (kind, k) == ("beam", 6):
            rows += runs(f"{kind} {k}", "vllm", beam6_vllm, beam6_vllm_fail, (0, 1))
        else:
            rows += runs(f"{kind} {k}", "vllm", (2, 4, 8), (12,), (0, 1))
    return rows


def test_fig14_counts_seeds_and_prints_a_decided_bound_gap(tmp_path: Path) -> None:
    """The section names the number of distinct seeds (not runs), prints a beam-6 gap that
    is a bound but decided (every allowed ratio >= 16/4 = 4 > 2.3) as that bound, and adds
    the bounds legend when a rate is only a bound."""
    text = fig14_sampling.write(_fig14_rows((2, 4, 8, 16), ()), tmp_path, pyplot(headless=True))
    assert "on 2 seed(s) per rate" in text
    gap = next(line for line in text.splitlines() if line.startswith("Gap at beam width 6"))
    assert gap.startswith("Gap at beam width 6: kvlab − paper ≥ +1.70× (ratio points; ")
    assert "≥ marks a rate that is only a lower bound" in text


def test_fig14_without_bounds_has_no_bounds_legend(tmp_path: Path) -> None:
    """Every rate bracketed finely (ratio in [4/2.1, 4.1/2], below 2.3): no bounds legend,
    and the gap is the plain difference."""
    rows = _fig14_rows((2, 4), (4.1,), beam6_orca_fail=2.1)
    text = fig14_sampling.write(rows, tmp_path, pyplot(headless=True))
    assert "≥ marks" not in text
    assert "Gap at beam width 6: kvlab − paper = -0.30× (ratio points)." in text


# --- Fig. 16 and Fig. 17: the searches' configs and sections --------------------------------


def test_fig16_searches_share_the_prefix_only_in_vllm() -> None:
    """vLLM's runs enable prefix caching (the shared prefix is what Fig. 16 measures), Orca's
    do not; the prefixes are the paper's 80 (1-shot) and 341 (5-shot) tokens; the seed given
    reaches every run; the model is the paper's LLaMA-13B."""
    searches = fig16_prefix.searches(30.0, 7)
    assert [(s.setting, s.system) for s in searches] == [
        ("1-shot", "orca_oracle"), ("1-shot", "vllm"), ("5-shot", "orca_oracle"),
        ("5-shot", "vllm")]  # fmt: skip
    for s in searches:
        caching = "system.enable_prefix_caching=true" in s.fixed
        assert caching == (s.system == "vllm")
        prefix = {"1-shot": 80, "5-shot": 341}[s.setting]
        assert f"workload.prefix_len={prefix}" in s.fixed
        assert "seed=7" in s.fixed and "model=llama-13b" in s.fixed


def test_fig17_conversations_round_up_and_a_zero_rate_has_no_arrival_rate() -> None:
    """A nominal rate whose conversations over the trace are fractional rounds up (0.2 req/s
    × 30 s / 4 rounds = 1.5 -> 2 conversations); the actual arrival rate of rate <= 0 is NaN
    (no trace is built)."""
    assert fig17_chatbot.conversation_overrides(30.0, 0.2)[-1] == "workload.num_conversations=2"
    assert math.isnan(fig17_chatbot.arrival_rate(30.0, 0.0, 0))
    assert math.isnan(fig17_chatbot.arrival_rate(30.0, -1.0, 0))


def test_fig17_bounds_get_the_legend(tmp_path: Path) -> None:
    """Every system passed every rate tried: the rates are lower bounds and the section
    carries the bounds legend."""
    rows = [
        r
        for system in fig17_chatbot.SYSTEMS
        for r in runs("chatbot", system, (0.1, 0.2), (), (0,), trace_s=NAN)
    ]
    text = fig17_chatbot.write(rows, tmp_path, pyplot(headless=True))
    assert "≥ marks a rate that is only a lower bound" in text


# --- the sharing section's driver ----------------------------------------------------------


class _RecordingPool:
    """An executor that records what it is given and runs nothing."""

    def __init__(self) -> None:
        self.searches: list[Any] = []

    def submit(self, fn: Any, run: Any, search: Any, threshold: float) -> Any:
        self.searches.append(search)
        return None


def test_submit_runs_fig14_on_the_seeds_asked() -> None:
    """``seeds`` reaches Fig. 14's searches (every rate on that many seeds from ``seed``);
    Fig. 16 keeps the one seed."""
    pool = _RecordingPool()
    sharing.submit(pool, lambda *a: {}, 30.0, 4, 1.0, ["fig14", "fig16"], seeds=2)  # type: ignore[arg-type]
    fig14 = [s for s in pool.searches if s.figure == "fig14"]
    assert fig14 and all(s.seeds == (4, 5) for s in fig14)


def test_header_states_the_trace_length(tmp_path: Path) -> None:
    """The section's header states the trace length the searches were given."""
    assert "Traces of 45 s of arrivals" in sharing.write({}, tmp_path, None, 45.0, figures=())


@pytest.mark.parametrize(
    ("argv", "duration"),
    [([], sharing.DURATION_S), (["--full"], sharing.FULL_DURATION_S),
     (["--full", "--duration", "5"], 5.0)],
)  # fmt: skip
def test_main_picks_the_trace_length(
    argv: list[str], duration: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--full`` gives the paper's 1-hour traces, ``--duration`` overrides both; by default
    seed 0, a 1 s/token threshold and 3 seeds per Fig. 14 rate."""
    seen: list[tuple[Any, ...]] = []

    def submit(pool: Any, run: Any, d: float, seed: int, threshold: float, seeds: int) -> dict:
        seen.append((d, seed, threshold, seeds))
        return {}

    monkeypatch.setattr(sharing, "batch_logging", lambda: None)
    monkeypatch.setattr(sharing, "worker_pool", lambda workers: nullcontext(None))
    monkeypatch.setattr(sharing, "submit", submit)
    monkeypatch.setattr(sharing, "write", lambda jobs, out, plt, d: "text")
    monkeypatch.setattr(sharing, "_plt", lambda: None)
    sharing.main([*argv, "--out", str(tmp_path / "out")])
    assert seen == [(duration, 0, 1.0, 3)]


# --- sweep_plot ------------------------------------------------------------------------------


def test_sweep_aggregate_leaves_out_failed_runs_and_empty_cells() -> None:
    """A run that did not finish is left out even when it holds a number; a finished run
    with an empty metric is left out of the point but does not make the column unplottable;
    rows with no hue value form their own group."""
    frame = pd.DataFrame({
        "x": [1, 1, 1, 2, 2], "hue": ["a", "a", "a", None, None],
        "y": [1.0, 3.0, 100.0, None, 4.0], "status": ["ok", "ok", "failed", "ok", "ok"],
    })  # fmt: skip
    t = sweep_plot.aggregate(frame, "x", "y", "hue", Path("summary.csv"))
    a = t[t["hue"] == "a"].iloc[0]
    assert [a["mean"], a["min"], a["max"], a["runs"]] == [2.0, 1.0, 3.0, 2]
    missing = t[t["hue"].isna()]
    assert len(missing) == 1 and missing.iloc[0]["mean"] == 4.0 and missing.iloc[0]["runs"] == 1


@pytest.mark.parametrize(
    ("name", "label"),
    [("kv_sharing_saving_pct", "kv_sharing_saving_pct (%)"),
     ("request_throughput", "request_throughput (req/s)"),
     ("offered_rate", "offered_rate (req/s)"),
     ("output_throughput", "output_throughput (tokens/s)"), ("seed", "seed")],
)  # fmt: skip
def test_axis_labels_carry_units(name: str, label: str) -> None:
    """Units come from the metric's name: a table entry or its suffix; none: the name."""
    assert sweep_plot.axis_label(name) == label


@pytest.mark.parametrize(
    ("values", "log2"),
    [([8, 16, 32], True), ([8, 16], False), ([0, 8, 16, 32], False), ([8, 12, 16], False)],
)
def test_log2_axis_only_for_three_or_more_positive_powers_of_two(
    values: list[int], log2: bool
) -> None:
    """Block sizes get a log2 axis only when there are at least three, all powers of two > 0."""
    assert sweep_plot._powers_of_two(pd.Series(values)) is log2


def test_sweep_plot_draws_points_in_x_order_with_their_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line runs through the points in x order, and each error bar spans the point's
    runs from min to max (asymmetric about the mean)."""
    from experiments.report import figures

    kept: dict[str, Any] = {}

    def keep(fig: Any, out: Path, name: str) -> Path:
        kept[name] = fig
        return out / f"{name}.png"

    monkeypatch.setattr(figures, "save", keep)
    table = pd.DataFrame({"x": [4, 1, 2], "mean": [3.0, 2.0, 5.0], "min": [3.0, 0.0, 4.0],
                          "max": [3.0, 8.0, 6.0], "runs": [1, 3, 2]})  # fmt: skip
    sweep_plot.plot({"y": table}, "x", None, tmp_path)
    ax = kept["sweep_y"].axes[0]
    line = ax.get_lines()[0]
    assert list(line.get_xdata()) == [1, 2, 4] and list(line.get_ydata()) == [2.0, 5.0, 3.0]
    bars = ax.containers[0].lines[2][0].get_segments()
    assert [(seg[0][1], seg[1][1]) for seg in bars] == [(0.0, 8.0), (4.0, 6.0), (3.0, 3.0)]


def test_sweep_plot_refuses_an_out_that_is_a_file(tmp_path: Path, capsys: Any) -> None:
    """``--out`` naming a file is one error line and exit 2, before anything is written."""
    frame = pd.DataFrame({"x": [1], "y": [1.0], "status": ["ok"]})
    frame.to_csv(tmp_path / "summary.csv", index=False)
    taken = tmp_path / "taken"
    taken.write_text("")
    argv = [str(tmp_path), "--x", "x", "--y", "y", "--out", str(taken)]
    assert sweep_plot.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out ") and err.count("\n") == 1
    assert not (tmp_path / "sweep_y.csv").exists()


def test_sweep_metric_only_in_failed_runs_cannot_be_plotted() -> None:
    """A metric with numbers only in runs that did not finish holds no number to plot."""
    frame = pd.DataFrame({"x": [1, 2], "y": [None, 3.0], "status": ["ok", "failed"]})
    with pytest.raises(sweep_plot.SweepPlotError, match="holds no number in a finished row"):
        sweep_plot.aggregate(frame, "x", "y", None, Path("summary.csv"))


def test_fig15_figure_bars_are_the_sustained_rate_savings_over_the_papers_band() -> None:
    """Each panel's bars are the savings at the sustained rate, drawn over the paper's range
    (§6.3) as a band."""
    t = fig15_sharing.table(_fig15_rows())
    fig = fig15_sharing.draw_fig15(t)
    for ax, kind, heights in zip(fig.axes, ("n", "beam"), ([7.0, 5.0], [40.0, 60.0]), strict=True):
        bars = [p.get_height() for p in ax.patches if p.get_label() != "paper's range"]
        assert [h for h in bars if h == h] == heights  # n 6's NaN bar aside
        band = next(p for p in ax.patches if p.get_label() == "paper's range")
        ys = band.get_patch_transform().transform(band.get_path().vertices)[:, 1]
        assert (min(ys), max(ys)) == pytest.approx(fig15_sharing.PAPER_RANGE[kind])
    pyplot(headless=True).close(fig)


def test_write_reports_each_figures_own_files(tmp_path: Path) -> None:
    """``on_written`` gets each figure with its own file stems (Fig. 15 its own, though it
    reads Fig. 14's searches)."""
    from concurrent.futures import Future

    done: Future = Future()
    done.set_result(_fig15_rows())
    written: list[tuple[str, ...]] = []
    sharing.write({"fig14": [done]}, tmp_path, pyplot(headless=True), 30.0, ["fig15"],
                  on_written=lambda *a: written.append(a))  # fmt: skip
    assert written == [("fig15", "fig15_sharing.csv/.png/.pdf")]
    assert (tmp_path / "fig15_sharing.csv").is_file()


def test_at_max_rate_averages_numbers_over_seeds_but_keeps_the_seed() -> None:
    """Fig. 15 reads the saving at the sustained rate as the mean over its seeds' runs; the
    row keeps a real seed (not a mean of seeds)."""
    from experiments.report.rate_search import at_max_rate

    rows = [{"rate": 2.0, "seed": s, "passes": True, "kv_sharing_saving_pct": v}
            for s, v in ((3, 10.0), (4, 20.0))]  # fmt: skip
    best = at_max_rate(rows)
    assert best is not None and best["kv_sharing_saving_pct"] == 15.0 and best["seed"] == 3
