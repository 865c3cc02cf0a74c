"""``offered_rate``: the requests a run was offered over their arrival window (the configured
window where the workload has one, else the span from t = 0 to the last arrival), in
``metrics.json``, the results table, the runs index and the rate searches' rows; and
``p99_tpot_ms`` beside it in those rows."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from core.metrics.summary import offered_rate
from core.workload.spec import _window_log, load_workload
from core.workload.vllm_log import LoggedRequest
from experiments import capacity
from experiments.lib import results
from experiments.lib.cli import check_index_writable
from experiments.lib.table import result_table
from experiments.report.rate_search import KEEP, search_rate
from experiments.reproduce import compose_config
from experiments.simulate import run

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _azure(path: Path, rows: list[tuple[float, int, int]]) -> Path:
    """An Azure trace file of ``rows`` (seconds after 18:15:00, prompt, output)."""
    path.write_text(AZURE_HEADER + "".join(
        f"2023-11-16 18:{15 + int(t // 60):02d}:{t % 60:09.6f},{p},{o}\n" for t, p, o in rows
    ))  # fmt: skip
    return path


@pytest.mark.parametrize(
    ("arrivals", "window", "want"),
    [
        ([], None, math.nan),  # no request
        ([0.0], None, math.nan),  # one request at the trace's start: no span
        ([0.0, 0.0, 0.0], None, math.nan),  # all at t = 0 (all_at_once)
        ([2.0], None, 0.5),  # one request 2 s into the replay (a window from start_s)
        ([0.0, 1.0, 4.0], None, 0.75),  # the span from 0, not from the first arrival
        ([0.5, 1.0, 4.0], None, 0.75),
        ([0.0, 1.0, 4.0], 6.0, 0.5),  # the configured window, not the span
        ([0.0, 0.0], 4.0, 0.5),
    ],
)
def test_offered_rate_is_the_requests_over_their_window(
    arrivals: list[float], window: float | None, want: float
) -> None:
    got = offered_rate(arrivals, window)
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want)


def test_the_window_is_the_configured_one_where_it_holds_the_arrivals(tmp_path: Path) -> None:
    """A drawn workload's duration_s; a trace's duration_s only where it cut an arrival and
    no request count cut the window shorter; else None (the arrivals' own span)."""
    drawn = {"kind": "synthetic", "rate": 4.0, "duration_s": 20.0}
    assert load_workload(drawn).window_s == 20.0
    counted = {"kind": "synthetic", "rate": 4.0, "num_requests": 10}
    assert load_workload(counted).window_s is None
    path = str(_azure(tmp_path / "a.csv", [(float(t), 100, 10) for t in range(10)]))
    trace = {"kind": "azure", "path": path}
    assert load_workload(trace).window_s is None
    assert load_workload({**trace, "duration_s": 4.5}).window_s == 4.5  # cut at 5 s
    assert load_workload({**trace, "duration_s": 30.0}).window_s is None  # past the end
    assert load_workload({**trace, "duration_s": 4.5, "num_requests": 3}).window_s is None
    assert load_workload({**trace, "duration_s": 4.5, "num_requests": 9}).window_s == 4.5
    # the replay's clock: after time_scale, from start_s
    scaled = load_workload({**trace, "time_scale": 2.0, "start_s": 4.0, "duration_s": 6.0})
    assert scaled.window_s == 6.0 and [r.arrival_time for r in scaled.requests] == [0, 2, 4]
    assert offered_rate([r.arrival_time for r in scaled.requests], scaled.window_s) == 0.5


def test_a_vllm_logs_window_follows_the_same_rule() -> None:
    logged = [LoggedRequest(i, 10, 5, float(i), math.nan, 0.0, 0.0, i) for i in range(6)]
    c = {"duration_s": 3.5, "num_requests": None}
    assert _window_log(logged, c)[1] == 3.5
    assert _window_log(logged, {**c, "duration_s": 10.0})[1] is None
    assert _window_log(logged, {**c, "num_requests": 2})[1] is None


def test_metrics_json_the_table_and_the_summary_line_give_the_offered_rate(
    tmp_path: Path,
) -> None:
    """A 30-s synthetic window: the requests over 30 s, whatever the drain after it."""
    metrics = run(compose_config(["workload.duration_s=30", "workload.rate=2"]), tmp_path)
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["offered_rate"] == pytest.approx(saved["num_requests"] / 30.0)
    assert saved["offered_rate"] == metrics["offered_rate"]
    table = result_table(saved)
    line = next(x for x in table.splitlines() if x.startswith("Offered request rate (req/s):"))
    assert line.split(":")[1].strip() == f"{saved['offered_rate']:.2f}"
    assert f"(offered {saved['offered_rate']:.3g})" in results.summary_line(saved, "rate=2")


def test_arrivals_all_at_once_offer_no_rate(tmp_path: Path) -> None:
    run(compose_config(["workload.duration_s=null", "workload.num_requests=4",
                        "workload.arrival=all_at_once"]), tmp_path)  # fmt: skip
    assert json.loads((tmp_path / "metrics.json").read_text())["offered_rate"] is None
    assert "Offered request rate (req/s):" in result_table({"offered_rate": None})


def test_a_trace_replay_offers_the_rate_capacity_names(tmp_path: Path) -> None:
    """Capacity replays a trace at rate r with time_scale trace_rate / r and its window
    scaled alike: the run's offered_rate is r, with a window that cuts the trace and with
    one past its end."""
    rows = [(0.7 * i, 100 + i, 10) for i in range(30)]
    path = _azure(tmp_path / "a.csv", rows)
    for window in (10.0, 100.0):
        base_cfg = compose_config(["workload=azure_conv", f"workload.path={path}",
                                   f"workload.duration_s={window}"])  # fmt: skip
        requests = load_workload(dict(base_cfg.workload)).requests
        cuts = window < rows[-1][0]
        base = capacity.trace_rate(requests, window if cuts else None, False)
        for rate in (0.5, 3.0):
            over = capacity._time_scale(base, window, None, rate)
            cfg = compose_config(["workload=azure_conv", f"workload.path={path}", *over])
            assert run(cfg)["offered_rate"] == pytest.approx(rate, rel=1e-12)


def _fake_run(label: str, overrides: list[str]) -> dict[str, Any]:
    return {"num_requests": 10, "completed": 10, "normalized_latency": 0.1,
            "offered_rate": 1.5, "p99_tpot_ms": 42.0}  # fmt: skip


def test_rate_search_rows_keep_the_offered_rate_and_p99_tpot() -> None:
    """runs.csv of capacity and the report's searches: each run's offered_rate and
    p99_tpot_ms, beside the mean TPOT."""
    assert KEEP.index("p99_tpot_ms") == KEEP.index("mean_tpot_ms") + 1
    rows = search_rate(_fake_run, "s", lambda rate, seed: [], [1.0], 1.0, bisect_evals=0,
                       grow_to=1.0)  # fmt: skip
    assert rows and all(r["offered_rate"] == 1.5 and r["p99_tpot_ms"] == 42.0 for r in rows)


def test_the_index_gains_the_column_and_an_earlier_index_keeps_its_own(tmp_path: Path) -> None:
    """A new index has ``offered_rate`` beside the throughput; one begun before it is still a
    runs index (not refused), and its rows go on in its own columns."""
    new = tmp_path / "new.csv"
    results.append_index(new, "simulate", "ok", tmp_path, [], {"offered_rate": 2.0})
    header, row = new.read_text().splitlines()
    columns = header.split(",")
    assert columns.index("offered_rate") + 1 == columns.index("request_throughput")
    assert row.split(",")[columns.index("offered_rate")] == "2"
    old = tmp_path / "old.csv"
    old.write_text(",".join(results.EARLIER_INDEX_COLUMNS) + "\n")
    check_index_writable(old)  # not refused as a foreign file
    results.append_index(old, "simulate", "ok", tmp_path, ["a=1"], {"offered_rate": 2.0,
                                                                    "completed": 3})  # fmt: skip
    lines = old.read_text().splitlines()
    assert lines[0] == ",".join(results.EARLIER_INDEX_COLUMNS) and len(lines) == 2
    assert len(lines[1].split(",")) == len(results.EARLIER_INDEX_COLUMNS)
    assert lines[1].split(",")[results.EARLIER_INDEX_COLUMNS.index("completed")] == "3"
